// Transformer layers and stacks with PyTorch's arguments, state-dict names and behaviour.
//
// Shapes: src/tgt [L, B, d_model] (batch_first = false, PyTorch's default) or [B, L, d_model];
// memory likewise with its own length. Masks as nn.MultiheadAttention: bool true = not allowed,
// floats added.
//
// TransformerEncoderLayer state dict: self_attn.{in_proj_weight, in_proj_bias, out_proj.weight,
// out_proj.bias}, linear1.{weight, bias}, linear2.{weight, bias}, norm1.{weight, bias},
// norm2.{weight, bias}. TransformerDecoderLayer adds multihead_attn.* and norm3.*. Stacks:
// layers.<i>.*, norm.* (final norm). bias = false drops every bias, as PyTorch's bias=False: the
// attention projections', linear1's, linear2's and the LayerNorms' (norm*.weight only), the stacks'
// final norm included (as torch.nn.Transformer(bias=False) builds it).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attn/nn/layers.h"
#include "attn/nn/multihead_attention.h"

namespace attn::nn {

struct TransformerLayerOptions {
  int64_t d_model = 512;
  int64_t nhead = 8;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;  // every dropout of the layer, as torch's, unless a site below sets its own
  // Per-site probabilities (unset: `dropout`), for models that place dropout elsewhere than torch's
  // layer (BERT has none inside the feed-forward, DistilBERT none after the attention either):
  // the attention weights (every attention); inside the feed-forward, after its activation; each
  // attention sublayer's output before its residual add; the feed-forward's output before its add.
  std::optional<double> attention_dropout{};
  std::optional<double> activation_dropout{};
  std::optional<double> attention_output_dropout{};
  std::optional<double> ffn_output_dropout{};
  Activation activation = Activation::relu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;  // false: no bias anywhere in the layer (see the state dict above)
  DType dtype = DType::f32;
  // attn's extensions of the self-attention (see MultiHeadAttentionOptions).
  int64_t num_kv_heads = 0;
  AttentionKind attention = AttentionKind::softmax;
  PositionScheme position = PositionScheme::none;
  int64_t max_distance = 16;
  int64_t num_buckets = 32;
  Backend backend = Backend::automatic;
  // Activation checkpointing (encoder layers): in training, keep only the layer's input and
  // recompute the layer inside backward (same dropout patterns). Saves the layer's activations at
  // the cost of one forward.
  bool checkpoint = false;
};

struct EncoderMasks {
  Tensor mask{};                  // src_mask: [L, L] or [B * nhead, L, L]
  Tensor src_key_padding_mask{};  // [B, L]
  bool is_causal = false;
  bool need_weights = false;  // keep the self-attention weights per head (attention_weights())
};

class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerLayerOptions& options);
  Tensor forward(const Tensor& src, const EncoderMasks& masks = {});
  Tensor backward(const Tensor& dy);
  // Per-head self-attention weights [B, nhead, L, L] of the last forward with need_weights, else
  // undefined.
  const Tensor& attention_weights() const { return weights_; }
  void set_checkpoint(bool on) { o_.checkpoint = on; }

  MultiHeadAttention self_attn;
  FeedForward ff;  // linear1, linear2 (named at the layer's level, as PyTorch)
  LayerNorm norm1, norm2;

 private:
  Tensor run(const Tensor& x, const EncoderMasks& masks);
  void seed_sublayers();  // the sublayers' dropout seeds, derived from saved_seed_
  void on_seed(uint64_t seed) override { seed_ = seed, calls_ = 0; }
  TransformerLayerOptions o_;
  Dropout dropout1_, dropout2_;
  Tensor weights_;
  // checkpointing: the input, the masks and the dropout seed of the last forward
  Tensor saved_x_;
  EncoderMasks saved_masks_;
  uint64_t seed_, calls_ = 0, saved_seed_ = 0;
  bool recompute_ = false;
  bool cast_ = false;  // the last forward ran under autocast (the recompute does too)
};

// A stack of encoder layers with an optional final LayerNorm (PyTorch's
// TransformerEncoder(norm=...)). activation_dtype = bf16 rounds every activation passed between
// layers to bf16 (and checkpointed layers keep their saved input in bf16); weights, gradients and
// optimizer state stay f32.
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const TransformerLayerOptions& layer, int64_t num_layers,
                     bool final_norm = false, DType activation_dtype = DType::f32);
  Tensor forward(const Tensor& src, const EncoderMasks& masks = {});
  Tensor backward(const Tensor& dy);
  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  TransformerEncoderLayer& layer(int64_t i) { return *layers.at(static_cast<size_t>(i)); }

  std::vector<std::unique_ptr<TransformerEncoderLayer>> layers;
  std::unique_ptr<LayerNorm> norm;

 private:
  DType activation_dtype_;
};

struct DecoderMasks {
  Tensor tgt_mask{};                 // [Lt, Lt] or [B * nhead, Lt, Lt]
  Tensor memory_mask{};              // [Lt, Lm] or [B * nhead, Lt, Lm]
  Tensor tgt_key_padding_mask{};     // [B, Lt]
  Tensor memory_key_padding_mask{};  // [B, Lm]
  bool tgt_is_causal = false;
  bool memory_is_causal = false;
};

struct DecoderGrads {
  Tensor dtgt, dmemory;
};

// Self-attention on tgt, cross-attention to memory, feed-forward:
//   norm_first: x += sa(norm1(x)); x += mha(norm2(x), memory); x += ff(norm3(x))
//   otherwise:  x = norm1(x + sa(x)); x = norm2(x + mha(x, memory)); x = norm3(x + ff(x))
class TransformerDecoderLayer : public Module {
 public:
  explicit TransformerDecoderLayer(const TransformerLayerOptions& options);
  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks = {});
  DecoderGrads backward(const Tensor& dy);

  MultiHeadAttention self_attn, multihead_attn;
  FeedForward ff;
  LayerNorm norm1, norm2, norm3;

 private:
  TransformerLayerOptions o_;
  Dropout dropout1_, dropout2_, dropout3_;
  bool cast_ = false;  // the last forward ran under autocast
};

class TransformerDecoder : public Module {
 public:
  TransformerDecoder(const TransformerLayerOptions& layer, int64_t num_layers,
                     bool final_norm = false);
  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks = {});
  DecoderGrads backward(const Tensor& dy);  // dmemory summed over the layers

  std::vector<std::unique_ptr<TransformerDecoderLayer>> layers;
  std::unique_ptr<LayerNorm> norm;
};

}  // namespace attn::nn
