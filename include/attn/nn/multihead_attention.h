// MultiHeadAttention as torch.nn.MultiheadAttention, plus GQA, relative positions, RoPE, ALiBi and
// linear attention. It projects, splits heads, calls attn::attention (the `auto` backend unless
// told otherwise), merges heads and projects out; the backward calls attn::attention_backward.
//
// Shapes (batch_first = false, PyTorch's default): query [Lq, B, E], key [Lk, B, kdim], value [Lk,
// B, vdim]
// -> output [Lq, B, E]. With batch_first = true: [B, Lq, E] etc. Unbatched input is not accepted.
// Heads: Hq = num_heads, head_dim = E / Hq; keys and values have Hkv = num_kv_heads heads of
// head_dim (GQA: query head h reads kv head h / (Hq / Hkv)).
//
// State dict (PyTorch's names):
//   kdim == vdim == E: in_proj_weight [E + 2 Hkv hd, E], in_proj_bias [E + 2 Hkv hd]
//   otherwise:         q_proj_weight [E, E], k_proj_weight [Hkv hd, kdim], v_proj_weight [Hkv hd,
//   vdim],
//                      in_proj_bias [E + 2 Hkv hd]
//   out_proj.weight [E, E], out_proj.bias [E]
//   position = shaw: relative_key.weight [2 max_distance + 1, hd]; position = t5:
//   relative_attention_bias.weight [num_buckets, Hq] (Hugging Face T5's name).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/attention.h"
#include "attn/nn/layers.h"

namespace attn::nn {

enum class PositionScheme : uint8_t {
  none,
  rope,              // rotary, half-split pairs (i, i + hd/2) as GPT-NeoX / Llama
  rope_interleaved,  // rotary, adjacent pairs (2i, 2i + 1) as the RoFormer paper / GPT-J
  alibi,             // s -= slope_h * |i - j| with the paper's slopes
  shaw,              // s += scale * q_i . a[clip(j - i, -max_distance, max_distance)] (key side)
  t5,                // s += b[bucket(j - i), h], T5's log-spaced buckets
};
enum class AttentionKind : uint8_t {
  softmax,  // exact scaled dot-product attention (attn::attention)
  linear,   // phi(q) (sum_j phi(k_j) v_j^T) / (phi(q) . sum_j phi(k_j)), phi = elu + 1; O(L) memory
};

struct MultiHeadAttentionOptions {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  int64_t num_kv_heads = 0;  // 0 = num_heads
  double dropout = 0.0;      // on the attention weights, training only (softmax attention)
  bool bias = true;
  int64_t kdim = 0;  // 0 = embed_dim
  int64_t vdim = 0;  // 0 = embed_dim
  bool batch_first = false;
  DType dtype = DType::f32;
  AttentionKind kind = AttentionKind::softmax;
  PositionScheme position = PositionScheme::none;
  int64_t max_distance = 16;  // shaw: the clip distance; t5: the distance of the last bucket
  int64_t num_buckets = 32;   // t5
  bool bidirectional = true;  // t5: separate buckets for j < i and j > i
  double rope_base = 10000.0;
  Backend backend = Backend::automatic;
  int threads = 0;
};

// Masks with nn.MultiheadAttention's polarity: bool true = NOT allowed; float values are added to
// the scores (-inf removes the key).
struct AttentionMasks {
  Tensor key_padding_mask{};  // [B, Lk]
  Tensor attn_mask{};         // [Lq, Lk] or [B * Hq, Lq, Lk]
  bool is_causal = false;     // query i may use keys j <= i (top-left, as PyTorch)
  bool need_weights = false;
  bool average_attn_weights =
      true;                     // weights [B, Lq, Lk] averaged over heads, else [B, Hq, Lq, Lk]
  int64_t position_offset = 0;  // position of query 0 (and key 0) for RoPE / relative schemes
};

struct MhaOutput {
  Tensor output{};   // the query's layout: [Lq, B, E] or [B, Lq, E]
  Tensor weights{};  // when need_weights: softmax weights before dropout (batch first always)
};
struct MhaGrads {
  Tensor dquery, dkey, dvalue;  // the layouts of query, key, value
};

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  MultiHeadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0,
                     bool batch_first = false, DType dtype = DType::f32);

  MhaOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                    const AttentionMasks& masks = {});
  // Self-attention: forward(x, x, x, masks); backward_self returns dquery + dkey + dvalue.
  MhaOutput forward_self(const Tensor& x, const AttentionMasks& masks = {}) {
    return forward(x, x, x, masks);
  }
  MhaGrads backward(const Tensor& doutput);
  Tensor backward_self(const Tensor& doutput);

  const MultiHeadAttentionOptions& options() const { return o_; }
  int64_t head_dim() const { return hd_; }
  // The ALiBi slopes of this module's heads (position == alibi), else empty.
  const std::vector<double>& head_slopes() const { return alibi_; }
  Linear out_proj;

 private:
  void on_seed(uint64_t seed) override;
  void release_cache() override { c_ = Cache{}; }
  // query, key, value: floating, 3-d, last dims embed_dim / kdim / vdim (else attn::Error).
  void check_inputs(const Tensor& query, const Tensor& key, const Tensor& value) const;
  // bf16 (the module's dtype, or autocast): the projections on the bf16 weights in16().
  void project(const Tensor& xq, const Tensor& xk, const Tensor& xv, Tensor& q, Tensor& k,
               Tensor& v, bool bf16) const;
  void project_packed(const Tensor& x, Tensor& qkv, bool bf16) const;
  struct InProj16 {
    const uint16_t *wq, *wk, *wv, *b;  // the q / k / v weights [out, in]; b: in_proj_bias or null
  };
  // The input projections' bf16 weights: the module's own (bf16) or the autocast copies (cache).
  InProj16 in16() const;
  void cast_weights();  // autocast: the copies, into the cache
  // The gradients of the inputs, batch first, in the compute dtype (autocast: f32).
  MhaGrads backward_rows(const Tensor& doutput);
  MultiHeadAttentionOptions o_;
  int64_t E_, Hq_, Hkv_, hd_, kdim_, vdim_;
  bool packed_;
  Parameter* in_proj_weight_ = nullptr;
  Parameter* q_proj_weight_ = nullptr;
  Parameter* k_proj_weight_ = nullptr;
  Parameter* v_proj_weight_ = nullptr;
  Parameter* in_proj_bias_ = nullptr;
  Parameter* rel_table_ = nullptr;  // shaw [2 md + 1, hd] or t5 [buckets, Hq]
  std::vector<double> alibi_;
  uint64_t seed_;
  uint64_t calls_ = 0;

  // Cache of the last forward (batch-first, contiguous, compute dtype).
  struct Cache {
    Tensor xq, xk, xv;  // projection inputs [B*L, in]
    Tensor q, k, v;     // [B, H, L, hd] after positions
    Tensor out, lse;    // attention output [B, Hq, Lq, hd] and lse (softmax)
    AttentionOptions opts;
    int64_t B = 0, Lq = 0, Lk = 0, offset = 0;
    int threads = 0;
    bool has_bias = false;  // shaw / t5 add a bias through the add mask: its gradient is asked
    Tensor key_keep;        // linear attention: bool [B, Lk], true = key used; undefined = all
    // Autocast: the forward ran in bf16 on these copies of the in-projection weights / bias
    // (packed: w16[0] holds in_proj_weight), and the inputs came in these dtypes.
    bool cast = false;
    Tensor w16[3], b16;
    DType dtypes[3] = {DType::f32, DType::f32, DType::f32};
    bool defined = false;
  } c_;
};

}  // namespace attn::nn
