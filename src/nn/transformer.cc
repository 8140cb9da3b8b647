// Transformer encoder/decoder layers and stacks: forward, and the backward walking the residual
// branches in reverse.
#include "attn/nn/transformer.h"

#include "nn/ops.h"

namespace attn::nn {

using detail::add;
using detail::add_into;
using detail::fail;
using detail::mix;

namespace {

// The dropout probability of one site: its own when set, else the layer's.
double at(const std::optional<double>& site, const TransformerLayerOptions& o) {
  return site.value_or(o.dropout);
}

MultiHeadAttentionOptions attention_options(const TransformerLayerOptions& o, bool self) {
  MultiHeadAttentionOptions m;
  m.embed_dim = o.d_model;
  m.num_heads = o.nhead;
  m.dropout = at(o.attention_dropout, o);
  m.bias = o.bias;
  m.batch_first = o.batch_first;
  m.dtype = o.dtype;
  m.backend = o.backend;
  if (self) {
    m.num_kv_heads = o.num_kv_heads;
    m.kind = o.attention;
    m.position = o.position;
    m.max_distance = o.max_distance;
    m.num_buckets = o.num_buckets;
  }
  return m;
}

// A sublayer's attention masks, as nn.MultiheadAttention takes them.
AttentionMasks attention_masks(const Tensor& attn_mask, const Tensor& key_padding_mask,
                               bool is_causal) {
  AttentionMasks m;
  m.attn_mask = attn_mask;
  m.key_padding_mask = key_padding_mask;
  m.is_causal = is_causal;
  return m;
}

void check_layer_options(const char* fn, const TransformerLayerOptions& o) {
  if (o.d_model <= 0 || o.nhead <= 0 || o.dim_feedforward <= 0) {
    fail(fn, fmt::format("d_model ({}), nhead ({}) and dim_feedforward ({}) must be > 0", o.d_model,
                         o.nhead, o.dim_feedforward));
  }
  for (const auto& [name, p] : {std::pair<const char*, double>{"dropout", o.dropout},
                                {"attention_dropout", at(o.attention_dropout, o)},
                                {"activation_dropout", at(o.activation_dropout, o)},
                                {"attention_output_dropout", at(o.attention_output_dropout, o)},
                                {"ffn_output_dropout", at(o.ffn_output_dropout, o)}}) {
    if (!(p >= 0.0 && p < 1.0)) fail(fn, fmt::format("{} must be in [0, 1), got {}", name, p));
  }
}

// A layer's sequence input (src, tgt, memory): floating, 3-d, last dim d_model.
void check_sequence(const char* fn, const char* name, const Tensor& t,
                    const TransformerLayerOptions& o) {
  if (!t.defined() || !is_floating(t.dtype()) || t.dim() != 3 || t.size(2) != o.d_model) {
    fail(fn, fmt::format("{} must be floating {} with d_model = {}, got {}", name,
                         o.batch_first ? "[B, L, d_model]" : "[L, B, d_model]", o.d_model,
                         t.defined() ? t.shape_str() : "undefined"));
  }
}

void check_num_layers(const char* fn, int64_t num_layers) {
  if (num_layers < 0) fail(fn, fmt::format("num_layers must be >= 0, got {}", num_layers));
}

// A stack's num_layers copies of `layer` (registered as layers.<i>) and, when final_norm, its final
// LayerNorm (norm), as torch.nn.TransformerEncoder / TransformerDecoder name them; `add` is the
// stack's register_module.
template <class Layer, class Register>
void build_stack(const TransformerLayerOptions& layer, int64_t num_layers, bool final_norm,
                 std::vector<std::unique_ptr<Layer>>& layers, std::unique_ptr<LayerNorm>& norm,
                 Register&& add) {
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back(std::make_unique<Layer>(layer));
    add(fmt::format("layers.{}", i), *layers.back());
  }
  if (final_norm) {
    norm = std::make_unique<LayerNorm>(layer.d_model, layer.layer_norm_eps, true, layer.bias,
                                       layer.dtype);
    add("norm", *norm);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Encoder layer

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerLayerOptions& o)
    : self_attn((check_layer_options("attn::nn::TransformerEncoderLayer", o),
                 attention_options(o, true))),
      ff(o.d_model, o.dim_feedforward, o.activation, at(o.activation_dropout, o), o.dtype, o.bias),
      norm1(o.d_model, o.layer_norm_eps, true, o.bias, o.dtype),
      norm2(o.d_model, o.layer_norm_eps, true, o.bias, o.dtype),
      o_(o),
      dropout1_(at(o.attention_output_dropout, o)),
      dropout2_(at(o.ffn_output_dropout, o)),
      seed_(next_seed()) {
  register_module("self_attn", self_attn);
  register_module("", ff);
  register_module("norm1", norm1);
  register_module("norm2", norm2);
  register_module("dropout1", dropout1_);
  register_module("dropout2", dropout2_);
}

Tensor TransformerEncoderLayer::run(const Tensor& x, const EncoderMasks& masks) {
  AttentionMasks am = attention_masks(masks.mask, masks.src_key_padding_mask, masks.is_causal);
  am.need_weights = masks.need_weights && !recompute_;
  am.average_attn_weights = false;
  auto sa = [&](const Tensor& h) {
    MhaOutput r = self_attn.forward(h, h, h, am);
    if (am.need_weights) weights_ = r.weights;
    return dropout1_.forward(r.output);
  };
  if (o_.norm_first) {
    // x1 = x + sa(norm1(x)); y = x1 + ff(norm2(x1))
    const Tensor x1 = add(x, sa(norm1.forward(x)));
    return add(x1, dropout2_.forward(ff.forward(norm2.forward(x1))));
  }
  // x1 = norm1(x + sa(x)); y = norm2(x1 + ff(x1)), each residual add inside its norm's pass
  const Tensor x1 = norm1.forward_residual(x, sa(x));
  return norm2.forward_residual(x1, dropout2_.forward(ff.forward(x1)));
}

void TransformerEncoderLayer::seed_sublayers() {
  self_attn.manual_seed(mix(saved_seed_, 1));
  ff.manual_seed(mix(saved_seed_, 2));
  dropout1_.manual_seed(mix(saved_seed_, 3));
  dropout2_.manual_seed(mix(saved_seed_, 4));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src_in, const EncoderMasks& masks) {
  check_sequence("attn::nn::TransformerEncoderLayer::forward", "src", src_in, o_);
  cast_ = detail::autocasts(o_.dtype);
  const Tensor src = detail::as_module_input(src_in, o_.dtype, cast_);
  // Each forward gives the sublayers' dropouts a fresh seed; checkpointing replays it in backward.
  saved_seed_ = mix(seed_, calls_++);
  seed_sublayers();
  weights_ = Tensor();
  Tensor y = run(src, masks);
  if (o_.checkpoint && is_training() && grad_enabled()) {
    // Keep the input (in its own dtype: bf16 under a bf16 stack) and drop every cached activation.
    saved_x_ = src_in.contiguous();
    saved_masks_ = masks;
    free_cache();
  } else {
    saved_x_ = Tensor();
  }
  return y;
}

Tensor TransformerEncoderLayer::backward(const Tensor& dy_in) {
  if (saved_x_.defined()) {
    // Checkpointed: replay the forward with the same dropout seeds to rebuild the caches.
    seed_sublayers();
    recompute_ = true;
    {
      const Autocast scope(cast_);
      run(detail::as_module_input(saved_x_, o_.dtype, cast_), saved_masks_);
    }
    recompute_ = false;
    saved_x_ = Tensor();
  }
  const Tensor dy = detail::as_module_input(dy_in, o_.dtype, cast_);
  if (o_.norm_first) {
    // y = x1 + dropout2(ff(norm2(x1))): dx1 = dy + norm2'(ff'(dropout2'(dy)))
    Tensor dx1 = add(dy, norm2.backward(ff.backward(dropout2_.backward(dy))));
    // x1 = x + dropout1(sa(norm1(x))): dx = dx1 + norm1'(sa'(dropout1'(dx1)))
    return add(dx1, norm1.backward(self_attn.backward_self(dropout1_.backward(dx1))));
  }
  // y = norm2(x1 + dropout2(ff(x1)))
  const Tensor dz2 = norm2.backward(dy);
  // x1 = norm1(x + dropout1(sa(x))); x1's gradient dz2 + ff'(dz2) is summed inside norm1's backward
  const Tensor dz1 = norm1.backward_sum(dz2, ff.backward(dropout2_.backward(dz2)));
  return add(dz1, self_attn.backward_self(dropout1_.backward(dz1)));
}

// ---------------------------------------------------------------------------------------------------------
// Encoder stack

TransformerEncoder::TransformerEncoder(const TransformerLayerOptions& layer, int64_t num_layers,
                                       bool final_norm, DType activation_dtype)
    : activation_dtype_(activation_dtype) {
  constexpr const char* fn = "attn::nn::TransformerEncoder";
  check_num_layers(fn, num_layers);
  if (activation_dtype != DType::f32 && activation_dtype != DType::f64 &&
      activation_dtype != DType::bf16) {
    fail(fn, fmt::format("activation_dtype must be f32, f64 or bf16, got {}",
                         dtype_name(activation_dtype)));
  }
  build_stack(layer, num_layers, final_norm, layers, norm,
              [this](const std::string& name, Module& m) { register_module(name, m); });
}

Tensor TransformerEncoder::forward(const Tensor& src, const EncoderMasks& masks) {
  Tensor x = src;
  for (auto& l : layers) {
    x = l->forward(x, masks);
    // bf16 activations: what passes between layers is rounded to bf16 (the next layer computes in
    // f32).
    if (activation_dtype_ == DType::bf16) x = x.to(DType::bf16);
  }
  if (norm) x = norm->forward(x);
  return x;
}

Tensor TransformerEncoder::backward(const Tensor& dy) {
  Tensor g = norm ? norm->backward(dy) : dy;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) g = (*it)->backward(g);
  return g;
}

// ---------------------------------------------------------------------------------------------------------
// Decoder layer

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerLayerOptions& o)
    : self_attn((check_layer_options("attn::nn::TransformerDecoderLayer", o),
                 attention_options(o, true))),
      multihead_attn(attention_options(o, false)),
      ff(o.d_model, o.dim_feedforward, o.activation, at(o.activation_dropout, o), o.dtype, o.bias),
      norm1(o.d_model, o.layer_norm_eps, true, o.bias, o.dtype),
      norm2(o.d_model, o.layer_norm_eps, true, o.bias, o.dtype),
      norm3(o.d_model, o.layer_norm_eps, true, o.bias, o.dtype),
      o_(o),
      dropout1_(at(o.attention_output_dropout, o)),
      dropout2_(at(o.attention_output_dropout, o)),
      dropout3_(at(o.ffn_output_dropout, o)) {
  register_module("self_attn", self_attn);
  register_module("multihead_attn", multihead_attn);
  register_module("", ff);
  register_module("norm1", norm1);
  register_module("norm2", norm2);
  register_module("norm3", norm3);
  register_module("dropout1", dropout1_);
  register_module("dropout2", dropout2_);
  register_module("dropout3", dropout3_);
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt_in, const Tensor& memory_in,
                                        const DecoderMasks& m) {
  constexpr const char* fn = "attn::nn::TransformerDecoderLayer::forward";
  check_sequence(fn, "tgt", tgt_in, o_);
  check_sequence(fn, "memory", memory_in, o_);
  cast_ = detail::autocasts(o_.dtype);
  const Tensor x = detail::as_module_input(tgt_in, o_.dtype, cast_);
  const Tensor mem = detail::as_module_input(memory_in, o_.dtype, cast_);
  const AttentionMasks sm = attention_masks(m.tgt_mask, m.tgt_key_padding_mask, m.tgt_is_causal);
  const AttentionMasks cm =
      attention_masks(m.memory_mask, m.memory_key_padding_mask, m.memory_is_causal);
  auto sa = [&](const Tensor& h) {
    return dropout1_.forward(self_attn.forward(h, h, h, sm).output);
  };
  auto ca = [&](const Tensor& h) {
    return dropout2_.forward(multihead_attn.forward(h, mem, mem, cm).output);
  };
  auto fb = [&](const Tensor& h) { return dropout3_.forward(ff.forward(h)); };
  if (o_.norm_first) {
    const Tensor x1 = add(x, sa(norm1.forward(x)));
    const Tensor x2 = add(x1, ca(norm2.forward(x1)));
    return add(x2, fb(norm3.forward(x2)));
  }
  const Tensor x1 = norm1.forward_residual(x, sa(x));
  const Tensor x2 = norm2.forward_residual(x1, ca(x1));
  return norm3.forward_residual(x2, fb(x2));
}

DecoderGrads TransformerDecoderLayer::backward(const Tensor& dy_in) {
  const Tensor dy = detail::as_module_input(dy_in, o_.dtype, cast_);
  DecoderGrads g;
  // The cross-attention's query gradient and its memory gradient (key + value).
  auto ca_back = [&](const Tensor& d) {
    MhaGrads mg = multihead_attn.backward(dropout2_.backward(d));
    g.dmemory = add(mg.dkey, mg.dvalue);
    return mg.dquery;
  };
  if (o_.norm_first) {
    const Tensor dx2 = add(dy, norm3.backward(ff.backward(dropout3_.backward(dy))));
    const Tensor dx1 = add(dx2, norm2.backward(ca_back(dx2)));
    g.dtgt = add(dx1, norm1.backward(self_attn.backward_self(dropout1_.backward(dx1))));
    return g;
  }
  const Tensor dz3 = norm3.backward(dy);
  const Tensor dz2 = norm2.backward_sum(dz3, ff.backward(dropout3_.backward(dz3)));
  const Tensor dz1 = norm1.backward_sum(dz2, ca_back(dz2));
  g.dtgt = add(dz1, self_attn.backward_self(dropout1_.backward(dz1)));
  return g;
}

// ---------------------------------------------------------------------------------------------------------
// Decoder stack

TransformerDecoder::TransformerDecoder(const TransformerLayerOptions& layer, int64_t num_layers,
                                       bool final_norm) {
  check_num_layers("attn::nn::TransformerDecoder", num_layers);
  build_stack(layer, num_layers, final_norm, layers, norm,
              [this](const std::string& name, Module& m) { register_module(name, m); });
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory,
                                   const DecoderMasks& masks) {
  Tensor x = tgt;
  for (auto& l : layers) x = l->forward(x, memory, masks);
  if (norm) x = norm->forward(x);
  return x;
}

DecoderGrads TransformerDecoder::backward(const Tensor& dy) {
  DecoderGrads total;
  Tensor g = norm ? norm->backward(dy) : dy;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    DecoderGrads lg = (*it)->backward(g);
    g = lg.dtgt;
    if (total.dmemory.defined())
      add_into(total.dmemory, lg.dmemory);
    else
      total.dmemory = lg.dmemory;
  }
  total.dtgt = g;
  return total;
}

}  // namespace attn::nn
