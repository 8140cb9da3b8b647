// MultiHeadAttention: projections, head split, positions, attn::attention, head merge, out_proj;
// and the backward walking the same steps in reverse.
#include "attn/nn/multihead_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/linear_attention.h"
#include "attn/nn/positional.h"
#include "nn/bf16.h"
#include "nn/ops.h"
#include "nn/relative_bias.h"

namespace attn::nn {

using detail::dispatch;
using detail::fail;
using detail::mix;

namespace {

// Columns [col0, col0 + H * hd) of rows [B * L, N] (contiguous) as heads [B, H, L, hd]: a strided
// view (attn::attention takes any strides), or a contiguous copy where the heads are rotated in place
// (RoPE) or read as rows of [B * H * L, hd] (linear attention, Shaw's bias).
Tensor split_heads(const Tensor& rows, int64_t B, int64_t L, int64_t H, int64_t hd, int64_t col0,
                   bool copy) {
  const int64_t N = rows.size(-1);
  const Tensor heads = rows.as_strided({B, H, L, hd}, {L * N, hd, N, 1}, col0);
  return copy ? heads.contiguous() : heads;
}

// Whether a and b are the same array (self-attention's query, key and value).
bool same_array(const Tensor& a, const Tensor& b) {
  return a.data() == b.data() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.strides() == b.strides();
}
Tensor merge_heads(const Tensor& x) {
  const int64_t B = x.size(0), H = x.size(1), L = x.size(2), hd = x.size(3);
  return x.permute({0, 2, 1, 3}).contiguous().view({B, L, H * hd});
}

// Layout <-> batch-first contiguous in the compute dtype.
Tensor to_batch_first(const Tensor& x, bool batch_first, DType dt) {
  return detail::as_compute(batch_first ? x : x.transpose(0, 1), dt);
}
Tensor from_batch_first(const Tensor& x, bool batch_first) {
  return batch_first ? x : x.transpose(0, 1).contiguous();
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, double dropout,
                                       bool batch_first, DType dtype)
    : MultiHeadAttention(MultiHeadAttentionOptions{.embed_dim = embed_dim,
                                                   .num_heads = num_heads,
                                                   .dropout = dropout,
                                                   .batch_first = batch_first,
                                                   .dtype = dtype}) {}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o)
    : out_proj(o.embed_dim > 0 ? o.embed_dim : 0, o.embed_dim > 0 ? o.embed_dim : 0, o.bias,
               o.dtype),
      o_(o) {
  constexpr const char* fn = "attn::nn::MultiHeadAttention";
  detail::check_module_dtype(o.dtype, fn);
  if (o.dtype == DType::bf16 &&
      (o.kind != AttentionKind::softmax || o.position != PositionScheme::none)) {
    fail(fn,
         "bf16 runs softmax attention without position schemes (compute rope, alibi, shaw, t5 "
         "and linear attention in f32)");
  }
  E_ = o.embed_dim;
  Hq_ = o.num_heads;
  Hkv_ = o.num_kv_heads > 0 ? o.num_kv_heads : o.num_heads;
  if (E_ <= 0 || Hq_ <= 0 || E_ % Hq_ != 0) {
    fail(fn, fmt::format("embed_dim ({}) must be > 0 and divisible by num_heads ({})", E_, Hq_));
  }
  if (o.num_kv_heads < 0 || Hq_ % Hkv_ != 0) {
    fail(fn, fmt::format("num_heads ({}) must be a multiple of num_kv_heads ({})", Hq_,
                         o.num_kv_heads));
  }
  if (!(o.dropout >= 0 && o.dropout < 1))
    fail(fn, fmt::format("dropout must be in [0, 1), got {}", o.dropout));
  if (o.kdim < 0 || o.vdim < 0)
    fail(fn, fmt::format("kdim {} and vdim {} must be >= 0", o.kdim, o.vdim));
  hd_ = E_ / Hq_;
  kdim_ = o.kdim > 0 ? o.kdim : E_;
  vdim_ = o.vdim > 0 ? o.vdim : E_;
  packed_ = kdim_ == E_ && vdim_ == E_;
  const int64_t kvE = Hkv_ * hd_;
  if ((o.position == PositionScheme::rope || o.position == PositionScheme::rope_interleaved) &&
      hd_ % 2 != 0) {
    fail(fn, fmt::format("RoPE needs an even head_dim, got {}", hd_));
  }
  if (o.kind == AttentionKind::linear && o.position != PositionScheme::none &&
      o.position != PositionScheme::rope && o.position != PositionScheme::rope_interleaved) {
    fail(fn, "linear attention supports positions none, rope and rope_interleaved only");
  }
  if (o.position == PositionScheme::shaw && o.max_distance < 1) {
    fail(fn, fmt::format("shaw needs max_distance >= 1, got {}", o.max_distance));
  }
  if (o.position == PositionScheme::t5 && (o.num_buckets < 4 || o.max_distance < o.num_buckets)) {
    fail(fn, fmt::format("t5 needs num_buckets >= 4 and max_distance >= num_buckets, got {} and {}",
                         o.num_buckets, o.max_distance));
  }
  // PyTorch: xavier_uniform_ on in_proj_weight (or each of q/k/v_proj_weight), zero in_proj_bias
  // and out_proj.bias; out_proj.weight keeps Linear's default init.
  if (packed_) {
    Tensor w = Tensor::empty({E_ + 2 * kvE, E_}, o.dtype);
    init_weight(w, Init::xavier_uniform);
    in_proj_weight_ = &register_parameter("in_proj_weight", w);
  } else {
    Tensor wq = Tensor::empty({E_, E_}, o.dtype), wk = Tensor::empty({kvE, kdim_}, o.dtype),
           wv = Tensor::empty({kvE, vdim_}, o.dtype);
    init_weight(wq, Init::xavier_uniform);
    init_weight(wk, Init::xavier_uniform);
    init_weight(wv, Init::xavier_uniform);
    q_proj_weight_ = &register_parameter("q_proj_weight", wq);
    k_proj_weight_ = &register_parameter("k_proj_weight", wk);
    v_proj_weight_ = &register_parameter("v_proj_weight", wv);
  }
  if (o.bias) {
    in_proj_bias_ = &register_parameter("in_proj_bias", Tensor::zeros({E_ + 2 * kvE}, o.dtype));
    out_proj.bias()->value.fill(0.0);
  }
  register_module("out_proj", out_proj);
  if (o.position == PositionScheme::shaw) {
    Tensor t = Tensor::empty({2 * o.max_distance + 1, hd_}, o.dtype);
    init_normal(t, 0.02);
    rel_table_ = &register_parameter("relative_key.weight", t);
  } else if (o.position == PositionScheme::t5) {
    Tensor t = Tensor::empty({o.num_buckets, Hq_}, o.dtype);
    init_normal(t, 0.02);
    rel_table_ = &register_parameter("relative_attention_bias.weight", t);
  } else if (o.position == PositionScheme::alibi) {
    alibi_ = alibi_slopes(Hq_);
  }
  seed_ = next_seed();
}

void MultiHeadAttention::on_seed(uint64_t seed) {
  seed_ = seed;
  calls_ = 0;
}

namespace {

// Builds the dense mask handed to attn::attention from nn.MultiheadAttention's masks (true = not
// allowed, floats added) and an optional additive bias [Bb, Hq, Lq, Lk] (Bb = 1 or B). Returns an
// undefined tensor when nothing masks. Bool-only masks stay bool (`drop`); anything floating makes
// an `add` mask of `dt` with -inf for the forbidden entries.
struct BuiltMask {
  Tensor mask;
  MaskType type = MaskType::drop;
};

BuiltMask build_mask(const char* fn, const AttentionMasks& m, const Tensor& bias, int64_t B,
                     int64_t Hq, int64_t Lq, int64_t Lk, DType dt) {
  const Tensor& kpm = m.key_padding_mask;
  const Tensor& am = m.attn_mask;
  if (kpm.defined()) {
    if (kpm.dim() != 2 || kpm.size(0) != B || kpm.size(1) != Lk ||
        !(kpm.dtype() == DType::boolean || is_floating(kpm.dtype()))) {
      fail(fn, fmt::format("key_padding_mask must be bool or floating [B = {}, Lk = {}], got {} {}",
                           B, Lk, dtype_name(kpm.dtype()), kpm.shape_str()));
    }
  }
  bool am3 = false;
  if (am.defined()) {
    const bool ok2 = am.dim() == 2 && am.size(0) == Lq && am.size(1) == Lk;
    am3 = am.dim() == 3 && am.size(0) == B * Hq && am.size(1) == Lq && am.size(2) == Lk;
    if (!(ok2 || am3) || !(am.dtype() == DType::boolean || is_floating(am.dtype()))) {
      fail(fn, fmt::format("attn_mask must be bool or floating [Lq = {}, Lk = {}] or [B * "
                           "num_heads = {}, {}, {}], "
                           "got {} {}",
                           Lq, Lk, B * Hq, Lq, Lk, dtype_name(am.dtype()), am.shape_str()));
    }
  }
  const bool any_float = bias.defined() || (kpm.defined() && kpm.dtype() != DType::boolean) ||
                         (am.defined() && am.dtype() != DType::boolean);
  BuiltMask r;
  if (!kpm.defined() && !am.defined() && !bias.defined()) return r;
  if (!any_float && kpm.defined() != am.defined()) {
    // One bool mask: a broadcast view, no copy (attn::attention runs one that pads the ends of the
    // keys, HF's right-padded batches, as key lengths).
    r.mask = kpm.defined() ? kpm.reshape({B, 1, 1, Lk}) : (am3 ? am.reshape({B, Hq, Lq, Lk}) : am);
    r.type = MaskType::drop;
    return r;
  }
  const bool per_batch = kpm.defined() || am3 || (bias.defined() && bias.size(0) == B);
  const bool per_head = am3 || bias.defined();
  const int64_t Bm = per_batch ? B : 1, Hm = per_head ? Hq : 1;
  const std::vector<double> kv = kpm.defined() ? kpm.to_vector() : std::vector<double>();
  const std::vector<double> av = am.defined() ? am.to_vector() : std::vector<double>();
  const std::vector<double> bv = bias.defined() ? bias.to_vector() : std::vector<double>();
  const bool kpm_bool = kpm.defined() && kpm.dtype() == DType::boolean;
  const bool am_bool = am.defined() && am.dtype() == DType::boolean;
  r.type = any_float ? MaskType::add : MaskType::drop;
  r.mask = Tensor::empty({Bm, Hm, Lq, Lk}, any_float ? dt : DType::boolean);
  const double ninf = -std::numeric_limits<double>::infinity();
  int64_t e = 0;
  for (int64_t b = 0; b < Bm; ++b)
    for (int64_t h = 0; h < Hm; ++h)
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t j = 0; j < Lk; ++j, ++e) {
          bool forbidden = false;
          double add = 0.0;
          if (kpm.defined()) {
            const double x = kv[b * Lk + j];
            if (kpm_bool)
              forbidden |= x != 0.0;
            else
              add += x;
          }
          if (am.defined()) {
            const double x = av[((am3 ? (b * Hq + h) * Lq : 0) + i) * Lk + j];
            if (am_bool)
              forbidden |= x != 0.0;
            else
              add += x;
          }
          if (bias.defined()) add += bv[(((bias.size(0) == 1 ? 0 : b) * Hq + h) * Lq + i) * Lk + j];
          if (any_float) {
            store_from_double(static_cast<char*>(r.mask.data()) + e * dtype_size(dt), dt,
                              forbidden ? ninf : add);
          } else {
            r.mask.data_as<uint8_t>()[e] = forbidden;
          }
        }
  return r;
}

// need_weights with average_attn_weights: the weights [B, H, Lq, Lk] averaged over heads ->
// [B, Lq, Lk].
Tensor average_heads(const Tensor& weights, DType dt, const char* fn) {
  const int64_t B = weights.size(0), H = weights.size(1), Lq = weights.size(2),
                Lk = weights.size(3);
  Tensor avg = Tensor::zeros({B, Lq, Lk}, dt);
  dispatch(dt, fn, [&](auto tag) {
    using T = decltype(tag);
    const T* w = weights.data_as<T>();
    T* a = avg.data_as<T>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < Lq * Lk; ++e)
          a[b * Lq * Lk + e] += w[(b * H + h) * Lq * Lk + e] / T(H);
  });
  return avg;
}

// Linear attention's key_keep: bool [B, Lk], true = used, from a bool key_padding_mask [B, Lk]
// (true = padded); undefined when there is none.
Tensor kept_keys(const char* fn, const Tensor& kpm, int64_t B, int64_t Lk) {
  if (!kpm.defined()) return Tensor();
  if (kpm.dim() != 2 || kpm.size(0) != B || kpm.size(1) != Lk) {
    fail(fn,
         fmt::format("key_padding_mask must be [B = {}, Lk = {}], got {}", B, Lk, kpm.shape_str()));
  }
  std::vector<double> keep = kpm.to_vector();
  for (double& x : keep) x = x == 0.0 ? 1.0 : 0.0;
  return Tensor::from_vector({B, Lk}, keep, DType::boolean);
}

// Linear attention as MultiHeadAttention runs it: is_causal is top-left (PyTorch's, as the softmax
// path).
LinearAttentionOptions linear_options(bool causal, const Tensor& key_keep, int threads) {
  LinearAttentionOptions o;
  o.causal = causal;
  o.align = Align::top_left;
  o.key_keep = key_keep;
  o.threads = threads;
  return o;
}

}  // namespace

void MultiHeadAttention::check_inputs(const Tensor& query, const Tensor& key,
                                      const Tensor& value) const {
  for (auto [name, t, width] : {std::tuple{"query", &query, E_}, std::tuple{"key", &key, kdim_},
                                std::tuple{"value", &value, vdim_}}) {
    if (!t->defined() || !is_floating(t->dtype()) || t->dim() != 3 || t->size(2) != width) {
      fail("attn::nn::MultiHeadAttention::forward",
           fmt::format("{} must be floating {} with last dim {}, got {}", name,
                       o_.batch_first ? "[B, L, dim]" : "[L, B, dim]", width,
                       t->defined() ? t->shape_str() : "undefined"));
    }
  }
}

MhaOutput MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const AttentionMasks& masks) {
  constexpr const char* fn = "attn::nn::MultiHeadAttention::forward";
  // Autocast reaches softmax attention without position schemes (what bf16 runs); the others
  // compute in f32, out_proj too.
  const bool cast = detail::autocasts(o_.dtype) && o_.kind == AttentionKind::softmax &&
                    o_.position == PositionScheme::none;
  const Autocast scope(cast);
  const DType dt = cast ? DType::bf16 : o_.dtype;
  check_inputs(query, key, value);
  const Tensor xq = to_batch_first(query, o_.batch_first, dt);
  const Tensor xk = to_batch_first(key, o_.batch_first, dt);
  const Tensor xv = to_batch_first(value, o_.batch_first, dt);
  const int64_t B = xq.size(0), Lq = xq.size(1), Lk = xk.size(1);
  if (xk.size(0) != B || xv.size(0) != B || xv.size(1) != Lk) {
    fail(fn, fmt::format("query {}, key {} and value {} disagree on batch or key length",
                         query.shape_str(), key.shape_str(), value.shape_str()));
  }
  const int64_t kvE = Hkv_ * hd_;
  Cache& c = c_;
  c = Cache{};
  c.B = B, c.Lq = Lq, c.Lk = Lk, c.offset = masks.position_offset;
  c.xq = xq.view({B * Lq, E_});
  c.xk = xk.view({B * Lk, kdim_});
  c.xv = xv.view({B * Lk, vdim_});
  c.cast = cast;
  c.dtypes[0] = query.dtype(), c.dtypes[1] = key.dtype(), c.dtypes[2] = value.dtype();
  if (cast) cast_weights();
  const bool bf16 = dt == DType::bf16;
  const bool rope =
      o_.position == PositionScheme::rope || o_.position == PositionScheme::rope_interleaved;
  const bool copy = rope || o_.kind == AttentionKind::linear || o_.position == PositionScheme::shaw;
  if (packed_ && same_array(query, key) && same_array(key, value)) {
    // Self-attention: one product for q, k and v (x read once), the heads viewed from its rows.
    Tensor qkv = Tensor::empty({B * Lq, E_ + 2 * kvE}, dt);
    project_packed(c.xq, qkv, bf16);
    c.q = split_heads(qkv, B, Lq, Hq_, hd_, 0, copy);
    c.k = split_heads(qkv, B, Lk, Hkv_, hd_, E_, copy);
    c.v = split_heads(qkv, B, Lk, Hkv_, hd_, E_ + kvE, copy);
  } else {
    Tensor q = Tensor::empty({B * Lq, E_}, dt), k = Tensor::empty({B * Lk, kvE}, dt),
           v = Tensor::empty({B * Lk, kvE}, dt);
    project(c.xq, c.xk, c.xv, q, k, v, bf16);
    c.q = split_heads(q, B, Lq, Hq_, hd_, 0, copy);
    c.k = split_heads(k, B, Lk, Hkv_, hd_, 0, copy);
    c.v = split_heads(v, B, Lk, Hkv_, hd_, 0, copy);
  }
  if (rope) {
    Tensor qv = c.q.view({B * Hq_, Lq, hd_}), kv = c.k.view({B * Hkv_, Lk, hd_});
    const bool inter = o_.position == PositionScheme::rope_interleaved;
    rope_rotate(qv, masks.position_offset, o_.rope_base, inter, false);
    rope_rotate(kv, masks.position_offset, o_.rope_base, inter, false);
  }

  MhaOutput result;
  Tensor heads_out;
  // Small problems run on one thread: below ~1M multiply-adds the fork/join costs more than the
  // work.
  const double work =
      static_cast<double>(B * Hq_) * static_cast<double>(std::max(Lq, Lk)) *
      static_cast<double>(o_.kind == AttentionKind::linear ? hd_ : std::min(Lq, Lk)) *
      static_cast<double>(hd_);
  c.threads = o_.threads != 0 ? o_.threads : (work < 1e6 ? 1 : 0);
  if (o_.kind == AttentionKind::linear) {
    if (masks.attn_mask.defined() || masks.need_weights ||
        (masks.key_padding_mask.defined() && masks.key_padding_mask.dtype() != DType::boolean)) {
      fail(fn,
           "linear attention takes a bool key_padding_mask and is_causal only (no attn_mask, float "
           "masks or "
           "need_weights)");
    }
    c.opts.causal = masks.is_causal;
    c.key_keep = kept_keys(fn, masks.key_padding_mask, B, Lk);
    heads_out =
        linear_attention(c.q, c.k, c.v, linear_options(masks.is_causal, c.key_keep, c.threads));
  } else {
    AttentionOptions& opts = c.opts;
    opts.backend = o_.backend;
    opts.threads = c.threads;
    opts.causal = masks.is_causal;
    opts.align = Align::top_left;
    if (is_training() && o_.dropout > 0) {
      opts.dropout_p = o_.dropout;
      opts.seed = mix(seed_, calls_++);
    }
    if (!alibi_.empty()) opts.alibi_slopes = Tensor::from_vector({Hq_}, alibi_, DType::f64);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd_));
    // Relative biases enter through the add mask; its gradient (d scores) feeds their backward.
    Tensor bias;
    if (o_.position == PositionScheme::shaw) {
      bias = detail::shaw_bias(c.q, rel_table_->value, Lk, o_.max_distance, scale, fn);
    } else if (o_.position == PositionScheme::t5) {
      bias = detail::t5_bias(rel_table_->value, Lq, Lk, o_.bidirectional, o_.max_distance, dt);
    }
    // bf16: a float mask stays f32 (attn::attention takes any floating add mask).
    BuiltMask bm = build_mask(fn, masks, bias, B, Hq_, Lq, Lk, dt == DType::bf16 ? DType::f32 : dt);
    opts.mask = bm.mask;
    opts.mask_type = bm.type;
    c.has_bias = bias.defined();
    opts.mask_grad = c.has_bias;
    opts.return_weights = masks.need_weights;
    AttentionResult res = attention(c.q, c.k, c.v, opts);
    opts.return_weights = false;
    heads_out = res.out;
    c.lse = res.lse;
    if (masks.need_weights) {
      const DType wdt = dt == DType::bf16 ? DType::f32 : dt;  // bf16: the weights in f32
      const Tensor w = detail::as_compute(res.weights, wdt);
      result.weights = masks.average_attn_weights ? average_heads(w, wdt, fn) : w;
    }
  }
  c.out = heads_out;
  c.defined = true;
  const Tensor merged = merge_heads(heads_out);  // [B, Lq, E]
  result.output = from_batch_first(out_proj.forward(merged), o_.batch_first);
  end_forward();
  return result;
}

void MultiHeadAttention::cast_weights() {
  const auto bf16 = [](const Parameter* p) {
    return p ? detail::convert(p->value, DType::bf16) : Tensor();
  };
  c_.w16[0] = bf16(packed_ ? in_proj_weight_ : q_proj_weight_);
  c_.w16[1] = bf16(k_proj_weight_);
  c_.w16[2] = bf16(v_proj_weight_);
  c_.b16 = bf16(in_proj_bias_);
}

MultiHeadAttention::InProj16 MultiHeadAttention::in16() const {
  const bool own = o_.dtype == DType::bf16;
  const auto ptr = [own](const Parameter* p, const Tensor& copy) -> const uint16_t* {
    const Tensor& t = own ? (p ? p->value : copy) : copy;
    return t.defined() ? t.data_as<uint16_t>() : nullptr;
  };
  const int64_t kvE = Hkv_ * hd_;
  InProj16 w{};
  w.wq = ptr(packed_ ? in_proj_weight_ : q_proj_weight_, c_.w16[0]);
  w.wk = packed_ ? w.wq + E_ * E_ : ptr(k_proj_weight_, c_.w16[1]);
  w.wv = packed_ ? w.wk + kvE * E_ : ptr(v_proj_weight_, c_.w16[2]);
  w.b = ptr(in_proj_bias_, c_.b16);
  return w;
}

// q, k, v [B, L, *] = the rows of x [B * L, *] times row blocks of the weights, plus the bias rows.
// bf16: the bf16 weights, f32 accumulation.
void MultiHeadAttention::project(const Tensor& xq, const Tensor& xk, const Tensor& xv, Tensor& q,
                                 Tensor& k, Tensor& v, bool bf16) const {
  const int64_t kvE = Hkv_ * hd_;
  if (!bf16) {
    dispatch(o_.dtype, "attn::nn::MultiHeadAttention::forward", [&](auto tag) {
      using T = decltype(tag);
      const T* wq =
          packed_ ? in_proj_weight_->value.data_as<T>() : q_proj_weight_->value.data_as<T>();
      const T* wk = packed_ ? wq + E_ * E_ : k_proj_weight_->value.data_as<T>();
      const T* wv = packed_ ? wk + kvE * E_ : v_proj_weight_->value.data_as<T>();
      const T* bq = in_proj_bias_ ? in_proj_bias_->value.data_as<T>() : nullptr;
      detail::linear_forward(xq.data_as<T>(), xq.size(0), E_, wq, bq, E_, q.data_as<T>());
      detail::linear_forward(xk.data_as<T>(), xk.size(0), kdim_, wk, bq ? bq + E_ : nullptr, kvE,
                             k.data_as<T>());
      detail::linear_forward(xv.data_as<T>(), xv.size(0), vdim_, wv, bq ? bq + E_ + kvE : nullptr,
                             kvE, v.data_as<T>());
    });
    return;
  }
  const InProj16 w = in16();
  const uint16_t* b = w.b;
  const struct {
    const Tensor& x;
    const uint16_t* w;
    const uint16_t* b;
    Tensor& y;
  } parts[3] = {{xq, w.wq, b, q},
                {xk, w.wk, b ? b + E_ : nullptr, k},
                {xv, w.wv, b ? b + E_ + kvE : nullptr, v}};
  for (const auto& p : parts) {
    detail::gemm_bf16({.M = p.x.size(0),
                       .N = p.y.size(-1),
                       .K = p.x.size(1),
                       .x = p.x.data_as<uint16_t>(),
                       .w = p.w,
                       .bias = p.b,
                       .y16 = p.y.data_as<uint16_t>()});
  }
}

// qkv [B * L, E + 2 * kvE] = x [B * L, E] in_proj_weight^T + in_proj_bias: self-attention's three
// projections as one product (packed weights only).
void MultiHeadAttention::project_packed(const Tensor& x, Tensor& qkv, bool bf16) const {
  const int64_t M = x.size(0), N = qkv.size(1);
  if (bf16) {
    const InProj16 w = in16();
    detail::gemm_bf16({.M = M,
                       .N = N,
                       .K = E_,
                       .x = x.data_as<uint16_t>(),
                       .w = w.wq,
                       .bias = w.b,
                       .y16 = qkv.data_as<uint16_t>()});
    return;
  }
  dispatch(o_.dtype, "attn::nn::MultiHeadAttention::forward", [&](auto tag) {
    using T = decltype(tag);
    detail::linear_forward(x.data_as<T>(), M, E_, in_proj_weight_->value.data_as<T>(),
                           in_proj_bias_ ? in_proj_bias_->value.data_as<T>() : nullptr, N,
                           qkv.data_as<T>());
  });
}

MhaGrads MultiHeadAttention::backward_rows(const Tensor& doutput) {
  constexpr const char* fn = "attn::nn::MultiHeadAttention::backward";
  Cache& c = c_;
  detail::check_backward_dtype(o_.dtype, fn);
  if (!c.defined) fail(fn, kNoForwardToGoBack);
  const DType dt = c.cast ? DType::bf16 : o_.dtype;
  const int64_t B = c.B, Lq = c.Lq, Lk = c.Lk, kvE = Hkv_ * hd_;
  const Shape expect = o_.batch_first ? Shape{B, Lq, E_} : Shape{Lq, B, E_};
  if (!doutput.defined() || doutput.shape() != expect) {
    fail(fn, fmt::format("doutput must have the output's shape {}, got {}", shape_to_string(expect),
                         doutput.defined() ? doutput.shape_str() : "undefined"));
  }
  // Autocast: an f32 doutput reaches out_proj as it is (its bias sums before rounding).
  const bool f32_in = c.cast && doutput.defined() && doutput.dtype() == DType::f32;
  const Tensor dy = to_batch_first(doutput, o_.batch_first, f32_in ? DType::f32 : dt);
  const Tensor dmerged = out_proj.backward(dy);  // [B, Lq, E]
  const Tensor dheads =
      split_heads(dmerged.view({B * Lq, E_}), B, Lq, Hq_, hd_, 0, o_.kind == AttentionKind::linear);
  Tensor dq, dk, dv;
  if (o_.kind == AttentionKind::linear) {
    LinearAttentionGrads g = linear_attention_backward(
        dheads, c.q, c.k, c.v, linear_options(c.opts.causal, c.key_keep, c.threads));
    dq = g.dq;
    dk = g.dk;
    dv = g.dv;
  } else {
    AttentionGrads g = attention_backward(dheads, c.q, c.k, c.v, c.out, c.lse, c.opts);
    dq = g.dq;
    dk = g.dk;
    dv = g.dv;
    if (c.has_bias) {
      // d(bias) = d(add mask), reduced by attention_backward to the mask's shape [Bm, Hq, Lq, Lk].
      const Tensor dm = g.dmask.contiguous();
      if (o_.position == PositionScheme::shaw) {
        const double scale = 1.0 / std::sqrt(static_cast<double>(hd_));
        detail::shaw_bias_backward(dm, c.q, rel_table_->value, o_.max_distance, scale, dq,
                                   rel_table_->grad, fn);
      } else {
        detail::t5_bias_backward(dm, o_.bidirectional, o_.max_distance, rel_table_->grad);
      }
    }
  }
  if (o_.position == PositionScheme::rope || o_.position == PositionScheme::rope_interleaved) {
    // The rotation is orthogonal: its backward is the rotation by the opposite angle.
    const bool inter = o_.position == PositionScheme::rope_interleaved;
    Tensor dqv = dq.view({B * Hq_, Lq, hd_}), dkv = dk.view({B * Hkv_, Lk, hd_});
    rope_rotate(dqv, c.offset, o_.rope_base, inter, true);
    rope_rotate(dkv, c.offset, o_.rope_base, inter, true);
  }
  const Tensor dq_rows = merge_heads(dq), dk_rows = merge_heads(dk), dv_rows = merge_heads(dv);
  const DType dxt = c.cast ? DType::f32 : dt;  // autocast: the input gradients in f32
  Tensor dxq = Tensor::empty({B, Lq, E_}, dxt), dxk = Tensor::empty({B, Lk, kdim_}, dxt),
         dxv = Tensor::empty({B, Lk, vdim_}, dxt);
  if (c.cast) {
    const InProj16 w = in16();
    float* gb = in_proj_bias_ ? in_proj_bias_->grad.data_as<float>() : nullptr;
    Parameter* pq = packed_ ? in_proj_weight_ : q_proj_weight_;
    float* gwq = pq->grad.data_as<float>();
    float* gwk = packed_ ? gwq + E_ * E_ : k_proj_weight_->grad.data_as<float>();
    float* gwv = packed_ ? gwk + kvE * E_ : v_proj_weight_->grad.data_as<float>();
    const struct {
      const Tensor &dy, &x;
      int64_t N, in, out;
      const uint16_t* w;
      float *gw, *gb;
      Tensor& dx;
    } parts[3] = {
        {dq_rows, c.xq, B * Lq, E_, E_, w.wq, gwq, gb, dxq},
        {dk_rows, c.xk, B * Lk, kdim_, kvE, w.wk, gwk, gb ? gb + E_ : nullptr, dxk},
        {dv_rows, c.xv, B * Lk, vdim_, kvE, w.wv, gwv, gb ? gb + E_ + kvE : nullptr, dxv}};
    for (const auto& p : parts) {
      detail::linear_backward_bf16({.N = p.N,
                                    .in = p.in,
                                    .out = p.out,
                                    .dy = p.dy.data_as<uint16_t>(),
                                    .x = p.x.data_as<uint16_t>(),
                                    .w = p.w,
                                    .gw = p.gw,
                                    .gb = p.gb,
                                    .dx32 = p.dx.data_as<float>()});
    }
    return {dxq, dxk, dxv};
  }
  dispatch(dt, fn, [&](auto tag) {
    using T = decltype(tag);
    Parameter* pq = packed_ ? in_proj_weight_ : q_proj_weight_;
    const T* wq = pq->value.data_as<T>();
    T* gwq = pq->grad.data_as<T>();
    const T* wk = packed_ ? wq + E_ * E_ : k_proj_weight_->value.data_as<T>();
    T* gwk = packed_ ? gwq + E_ * E_ : k_proj_weight_->grad.data_as<T>();
    const T* wv = packed_ ? wk + kvE * E_ : v_proj_weight_->value.data_as<T>();
    T* gwv = packed_ ? gwk + kvE * E_ : v_proj_weight_->grad.data_as<T>();
    T* gb = in_proj_bias_ ? in_proj_bias_->grad.data_as<T>() : nullptr;
    detail::linear_backward(dq_rows.data_as<T>(), c.xq.data_as<T>(), B * Lq, E_, E_, wq, gwq, gb,
                            dxq.data_as<T>());
    detail::linear_backward(dk_rows.data_as<T>(), c.xk.data_as<T>(), B * Lk, kdim_, kvE, wk, gwk,
                            gb ? gb + E_ : nullptr, dxk.data_as<T>());
    detail::linear_backward(dv_rows.data_as<T>(), c.xv.data_as<T>(), B * Lk, vdim_, kvE, wv, gwv,
                            gb ? gb + E_ + kvE : nullptr, dxv.data_as<T>());
  });
  return {dxq, dxk, dxv};
}

namespace {
// An input's gradient in its layout and (autocast: the f32 sums rounded once) its dtype.
Tensor input_grad(const Tensor& rows, bool batch_first, bool cast, DType input_dtype) {
  const Tensor g = cast && input_dtype != DType::f32 ? detail::convert(rows, input_dtype) : rows;
  return from_batch_first(g, batch_first);
}
}  // namespace

MhaGrads MultiHeadAttention::backward(const Tensor& doutput) {
  const MhaGrads g = backward_rows(doutput);
  const bool bf = o_.batch_first, cast = c_.cast;
  return {input_grad(g.dquery, bf, cast, c_.dtypes[0]), input_grad(g.dkey, bf, cast, c_.dtypes[1]),
          input_grad(g.dvalue, bf, cast, c_.dtypes[2])};
}

Tensor MultiHeadAttention::backward_self(const Tensor& doutput) {
  MhaGrads g = backward_rows(doutput);
  detail::add_into(g.dquery, g.dkey);
  detail::add_into(g.dquery, g.dvalue);
  return input_grad(g.dquery, o_.batch_first, c_.cast, c_.dtypes[0]);
}

}  // namespace attn::nn
