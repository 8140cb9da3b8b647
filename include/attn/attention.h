// Scaled dot-product attention: the options of the contract (docs/semantics.md) and the two entry points.
//
//   q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]  ->  out [..., Hq, Lq, Dv], lse [..., Hq, Lq]
//
// Leading batch dims ("...") are equal across q, k, v (zero or more of them). Hq % Hkv == 0 and query head h
// reads kv head h / (Hq / Hkv). q, k, v share one floating dtype, which is the compute type: f64 computes in
// double, f32 / bf16 / f16 accumulate in fp32 or better.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "attn/tensor.h"

namespace attn {

enum class Backend : uint8_t { automatic, reference, cpu };
// Where query i sits among the keys: bottom_right p(i) = i + Lk - Lq (FlashAttention), top_left p(i) = i
// (PyTorch's is_causal).
enum class Align : uint8_t { bottom_right, top_left };
// The polarity of a dense mask, always named: keep (true = may attend, PyTorch SDPA), drop (true = masked,
// nn.MultiheadAttention's key_padding_mask / attn_mask), add (float added to the scores, -inf removes the key).
enum class MaskType : uint8_t { keep, drop, add };

Backend parse_backend(const std::string& name);     // "auto", "reference", "cpu"
Align parse_align(const std::string& name);         // "bottom-right", "top-left"
MaskType parse_mask_type(const std::string& name);  // "keep", "drop", "add"
const char* backend_name(Backend b);
const char* align_name(Align a);
const char* mask_type_name(MaskType m);

// Key j is usable by query i when p(i) - left <= j <= p(i) + right; -1 means unbounded on that side.
// causal == true is the window (-1, 0) intersected with this one.
struct Window {
  int64_t left = -1;
  int64_t right = -1;
};

// A boolean map over (query tile, key tile): tile (I, J) covers queries [I*block_q, (I+1)*block_q) and keys
// [J*block_k, ...). Shape broadcastable to [..., Hq, ceil(Lq / block_q), ceil(Lk / block_k)]; true = the
// tile may be attended (BigBird-style local + global + random layouts).
struct BlockLayout {
  Tensor layout;  // bool
  int64_t block_q = 0;
  int64_t block_k = 0;
};

struct AttentionOptions {
  std::optional<double> scale;    // default 1 / sqrt(D); any finite value (kScaleRule, options.h)
  std::optional<double> softcap;  // s = c * tanh(s / c); must be finite and > 0
  bool causal = false;
  Align align = Align::bottom_right;
  // Overrides `align`: query i sits at key position p(i) = i + position_offset. For chunked prefill and ring
  // attention, where this call's queries and keys are slices of a longer sequence.
  std::optional<int64_t> position_offset;
  Window window;
  Tensor mask;  // broadcastable to [..., Hq, Lq, Lk]; bool for keep/drop, floating for add
  MaskType mask_type = MaskType::keep;
  // integer, shape = the leading batch dims (or [B] with B their product); keys j >= len masked
  Tensor key_lengths;
  BlockLayout block_layout;
  Tensor alibi_slopes;  // floating [Hq]: s -= slope[h] * |p(i) - j|
  // floating [Hq], finite: learned attention sinks, one logit per query head that joins every row's
  // softmax denominator and carries no value (lse includes it; a row with no allowed key gives out 0
  // and lse = the sink)
  Tensor sinks;
  // in [0, 1]; weights are dropped with probability p and scaled by 1 / (1 - p) (p = 1: all)
  double dropout_p = 0.0;
  uint64_t seed = 0;  // dropout keep-pattern = f(seed, batch, head, i, j), same on every backend
  bool return_weights = false;  // weights [..., Hq, Lq, Lk] (before dropout); costs Lq * Lk memory
  // attention_backward also returns d(add mask), reduced to the mask's shape
  bool mask_grad = false;
  Backend backend = Backend::automatic;
  int threads = 0;  // <= 0: attn::set_num_threads, ATTN_NUM_THREADS, or all cores
};

struct AttentionResult {
  Tensor out;      // [..., Hq, Lq, Dv], the dtype of q
  Tensor lse;      // [..., Hq, Lq], f64 for f64 inputs, else f32; -inf on fully masked rows
  Tensor weights;  // defined only when return_weights; the dtype of out
};

struct AttentionGrads {
  Tensor dq, dk, dv;  // shapes and dtypes of q, k, v
  Tensor dmask;   // defined when mask_grad and mask_type == add: the shape of the mask, its dtype
  Tensor dsinks;  // defined when the options have sinks: [Hq], their dtype
};

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionOptions& options = {});

// Gradients of attention(q, k, v, options).out given dout = dL/dout; `out` and `lse` are that call's results
// (the backward recomputes the weights from the LSE). The options, seed included, must be the forward's.
// dweights, when given, is dL/dweights for the weights the forward returned (return_weights: P before
// dropout), [..., Hq, Lq, Lk], any floating dtype; its part (dS = P (dW - rowsum(P dW)) through the
// score's softcap, into dq, dk and, with mask_grad, dmask) is folded into the same gradients. Such a
// backward runs on the reference backend (in double, exact; O(Lq Lk D) scalar work) whatever the
// backend option says.
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& options = {},
                                  const Tensor& dweights = Tensor());

// The backend `automatic` resolves to for inputs of this dtype on this machine.
Backend resolve_backend(Backend requested, DType dtype);

}  // namespace attn
