// Random attention problems with any combination of options, and the runners the attention tests
// share.
#pragma once
#include <fmt/format.h>

#include <optional>
#include <string>

#include "attn/attention.h"
#include "naive_attention.h"
#include "test_util.h"

namespace attn::test {

// What a random problem contains. Each option is either off or drawn at random from the seed.
struct CaseSpec {
  Shape batch = {2};
  int64_t Hq = 2, Hkv = 1, Lq = 5, Lk = 7, D = 4, Dv = 3;
  DType dtype = DType::f64;
  Layout layout = Layout::contiguous;
  bool causal = false;
  Align align = Align::bottom_right;
  Window window;
  std::optional<MaskType> mask;  // random mask of this polarity
  Shape mask_shape;  // empty: the full [batch..., Hq, Lq, Lk]; else any broadcastable shape
  bool key_lengths = false;
  bool block_layout = false;
  int64_t block_q = 2, block_k = 3;
  bool alibi = false;
  double alibi_max = 1.0;  // slopes uniform in [0, alibi_max)
  bool sinks = false;      // sink logits uniform in [-1, 2)
  std::optional<double> softcap;
  std::optional<double> scale;
  double dropout = 0.0;
  double value_range = 2.0;  // q, k, v uniform in [-range, range)

  std::string describe() const {
    return fmt::format(
        "batch {} Hq {} Hkv {} Lq {} Lk {} D {} Dv {} {} {} causal {} align {} window ({}, {}) "
        "mask {} {} "
        "key_lengths {} block_layout {} ({}, {}) alibi {} softcap {} scale {} dropout {} sinks {}",
        shape_to_string(batch), Hq, Hkv, Lq, Lk, D, Dv, dtype_name(dtype), layout_name(layout),
        causal, align_name(align), window.left, window.right, mask ? mask_type_name(*mask) : "none",
        shape_to_string(mask_shape), key_lengths, block_layout, block_q, block_k,
        alibi ? alibi_max : 0.0, softcap ? *softcap : 0.0, scale ? *scale : 0.0, dropout, sinks);
  }
};

struct Case {
  Tensor q, k, v;
  AttentionOptions o;
};

// The case with q, k and v converted to dtype (masks and options as they are).
inline Case to_dtype(const Case& c, DType dtype) {
  Case r = c;
  r.q = c.q.to(dtype), r.k = c.k.to(dtype), r.v = c.v.to(dtype);
  return r;
}

inline Shape cat(const Shape& a, std::initializer_list<int64_t> b) {
  Shape s = a;
  s.insert(s.end(), b);
  return s;
}

inline Case make_case(const CaseSpec& s, uint64_t seed) {
  Case c;
  const double r = s.value_range;
  c.q = random_tensor(cat(s.batch, {s.Hq, s.Lq, s.D}), s.dtype, seed * 7 + 1, -r, r, s.layout);
  c.k = random_tensor(cat(s.batch, {s.Hkv, s.Lk, s.D}), s.dtype, seed * 7 + 2, -r, r, s.layout);
  c.v = random_tensor(cat(s.batch, {s.Hkv, s.Lk, s.Dv}), s.dtype, seed * 7 + 3, -r, r, s.layout);
  AttentionOptions& o = c.o;
  o.backend = Backend::reference;
  o.threads =
      1;  // tiny problems: an OpenMP team per call only costs time (tests that vary it say so)
  o.causal = s.causal;
  o.align = s.align;
  o.window = s.window;
  o.scale = s.scale;
  o.softcap = s.softcap;
  o.dropout_p = s.dropout;
  o.seed = seed * 1000003 + 17;
  Rng rng(seed * 7 + 4);
  if (s.mask) {
    const Shape ms = s.mask_shape.empty() ? cat(s.batch, {s.Hq, s.Lq, s.Lk}) : s.mask_shape;
    o.mask_type = *s.mask;
    if (*s.mask == MaskType::add) {
      // Finite biases with about one key in five removed by -inf.
      std::vector<double> vals(static_cast<size_t>(checked_numel(ms, "make_case")));
      for (double& x : vals)
        x = rng.bernoulli(0.2) ? -std::numeric_limits<double>::infinity() : rng.uniform(-2, 2);
      o.mask = Tensor::from_vector(ms, vals, s.dtype == DType::f64 ? DType::f64 : DType::f32);
    } else {
      o.mask = random_bool(ms, *s.mask == MaskType::keep ? 0.8 : 0.2, seed * 7 + 5);
    }
  }
  if (s.key_lengths) {
    int64_t B = 1;
    for (int64_t d : s.batch) B *= d;
    std::vector<double> lens(static_cast<size_t>(B));
    for (double& x : lens) x = static_cast<double>(rng.integer(0, s.Lk));
    o.key_lengths = Tensor::from_vector(s.batch, lens, DType::i64);
  }
  if (s.block_layout) {
    o.block_layout.block_q = s.block_q;
    o.block_layout.block_k = s.block_k;
    const int64_t nI = (s.Lq + s.block_q - 1) / s.block_q, nJ = (s.Lk + s.block_k - 1) / s.block_k;
    o.block_layout.layout = random_bool(cat(s.batch, {s.Hq, nI, nJ}), 0.7, seed * 7 + 6);
  }
  if (s.alibi) o.alibi_slopes = random_tensor({s.Hq}, DType::f64, seed * 7 + 7, 0.0, s.alibi_max);
  if (s.sinks) o.sinks = random_tensor({s.Hq}, DType::f64, seed * 7 + 8, -1.0, 2.0);
  return c;
}

// A spec with every option drawn at random: lengths in [1, max_len], head dims up to max_len / 2 +
// 1 (odd sizes included).
inline CaseSpec random_spec(uint64_t seed, int64_t max_len = 9) {
  Rng rng(seed);
  CaseSpec s;
  const int nb = static_cast<int>(rng.integer(0, 2));
  s.batch.clear();
  for (int d = 0; d < nb; ++d) s.batch.push_back(rng.integer(1, 2));
  s.Hkv = rng.integer(1, 2);
  s.Hq = s.Hkv * rng.integer(1, 3);
  s.Lq = rng.integer(1, max_len - 2 > 1 ? max_len - 2 : 1);
  s.Lk = rng.integer(1, max_len);
  s.D = rng.integer(1, max_len / 2 + 1);
  s.Dv = rng.integer(1, max_len / 2);
  s.causal = rng.bernoulli(0.4);
  s.align = rng.bernoulli(0.5) ? Align::bottom_right : Align::top_left;
  if (rng.bernoulli(0.4)) s.window = {rng.integer(-1, 3), rng.integer(-1, 3)};
  const int64_t m = rng.integer(0, 3);
  if (m > 0) {
    s.mask = static_cast<MaskType>(m - 1);
    if (rng.bernoulli(0.5))
      s.mask_shape = {s.Lq, s.Lk};  // broadcast over batch and heads
    else if (rng.bernoulli(0.5))
      s.mask_shape = {s.Hq, 1, s.Lk};
  }
  s.key_lengths = rng.bernoulli(0.3);
  s.block_layout = rng.bernoulli(0.3);
  s.block_q = rng.integer(1, 3 + max_len / 10);
  s.block_k = rng.integer(1, 4 + max_len / 10);
  s.alibi = rng.bernoulli(0.3);
  if (rng.bernoulli(0.3)) s.softcap = rng.uniform(0.5, 3.0);
  if (rng.bernoulli(0.3)) s.scale = rng.uniform(0.1, 1.5);
  if (rng.bernoulli(0.3)) s.dropout = rng.uniform(0.05, 0.6);
  s.layout = static_cast<Layout>(rng.integer(0, 3));
  s.sinks = rng.bernoulli(0.3);  // drawn last: the earlier draws of a seed stay what they were
  return s;
}

// Runs the reference backend with weights.
inline AttentionResult run_reference(const Case& c) {
  AttentionOptions o = c.o;
  o.backend = Backend::reference;
  o.return_weights = true;
  return attention(c.q, c.k, c.v, o);
}

// How gradcheck_reference differentiates: L = <G, out> alone, or + <W, weights> (the weights'
// gradient passed to attention_backward as dweights), and the backend option of the backward.
struct GradcheckLoss {
  bool weights = false;
  Backend backward_backend = Backend::reference;
};

// Finite-difference check of the reference backward on an f64 case: L = <G, out> with a fixed
// random G (plus <W, weights> with a fixed random W when loss.weights), with respect to q, k, v and
// (when the mask is of type add) the mask. Returns the report; relative() is the metric.
inline GradcheckReport gradcheck_reference(const Case& c, uint64_t seed,
                                           int64_t max_checks_per_input = -1,
                                           GradcheckLoss loss_kind = {}) {
  AttentionOptions o = c.o;
  o.backend = Backend::reference;
  o.return_weights = loss_kind.weights;
  const bool with_mask = o.mask.defined() && o.mask_type == MaskType::add;
  const AttentionResult fwd = attention(c.q, c.k, c.v, o);
  const Tensor G = random_tensor(fwd.out.shape(), DType::f64, seed, -1.0, 1.0);
  const Tensor W = loss_kind.weights
                       ? random_tensor(fwd.weights.shape(), DType::f64, seed + 7, -1.0, 1.0)
                       : Tensor();
  AttentionOptions ob = o;
  ob.mask_grad = with_mask;
  ob.backend = loss_kind.backward_backend;
  const AttentionGrads g = attention_backward(G, c.q, c.k, c.v, fwd.out, fwd.lse, ob, W);
  std::vector<Tensor> inputs = {c.q, c.k, c.v};
  std::vector<Tensor> grads = {g.dq, g.dk, g.dv};
  if (with_mask) {
    inputs.push_back(o.mask);
    grads.push_back(g.dmask);
  }
  const bool with_sinks = o.sinks.defined();
  if (with_sinks) {
    inputs.push_back(o.sinks);
    grads.push_back(g.dsinks);
  }
  auto loss = [&](const std::vector<Tensor>& x) {
    AttentionOptions of = o;
    if (with_mask) of.mask = x[3];
    if (with_sinks) of.sinks = x.back();
    const AttentionResult r = attention(x[0], x[1], x[2], of);
    return dot_all(G, r.out) + (loss_kind.weights ? dot_all(W, r.weights) : 0.0);
  };
  return gradcheck(loss, inputs, grads, kGradcheckEps, max_checks_per_input, seed + 1);
}

// gradcheck_reference on make_case(s, seed) passes: some gradient checked and nonzero, every one
// within kGradcheckTol of central differences.
inline void expect_gradcheck_passes(const CaseSpec& s, uint64_t seed, GradcheckLoss loss = {}) {
  const GradcheckReport rep = gradcheck_reference(make_case(s, seed), seed, -1, loss);
  EXPECT_GT(rep.checked, 0);
  EXPECT_GT(rep.max_abs_grad, 0.0) << s.describe();
  EXPECT_LE(rep.relative(), kGradcheckTol) << s.describe() << "\nworst: " << rep.worst;
}

}  // namespace attn::test
