// MultiHeadAttention: values against a direct per-head formula, masks and their polarity, gradients
// in double for every option, state-dict names.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::gradcheck;
using testing::GradProblem;
using testing::random_tensor;
using testing::rel_error;

// Direct reference in double, batch-first: x [B, L, E] -> out [B, Lq, E] and weights [B, H, Lq,
// Lk]. allowed(b, h, i, j) decides the mask; bias(b, h, i, j) is added to the scaled score.
struct Naive {
  Tensor out, weights;
};
Naive naive_mha(const MultiHeadAttention& m, const Tensor& xq, const Tensor& xk, const Tensor& xv,
                const std::function<bool(int64_t, int64_t, int64_t, int64_t)>& allowed) {
  const auto params = m.named_parameters();
  auto find = [&](const std::string& n) {
    for (auto& p : params)
      if (p.name == n) return p.value;
    return Tensor();
  };
  const Tensor W = find("in_proj_weight"), bias = find("in_proj_bias"),
               Wo = find("out_proj.weight"), bo = find("out_proj.bias");
  const int64_t B = xq.size(0), Lq = xq.size(1), Lk = xk.size(1), E = xq.size(2);
  const int64_t H = m.options().num_heads, hd = E / H;
  auto proj = [&](const Tensor& x, int64_t row0, int64_t b, int64_t l, int64_t o) {
    double s = bias.at({row0 + o});
    for (int64_t e = 0; e < E; ++e) s += x.at({b, l, e}) * W.at({row0 + o, e});
    return s;
  };
  Naive r;
  r.weights = Tensor::zeros({B, H, Lq, Lk}, DType::f64);
  Tensor heads = Tensor::zeros({B, Lq, E}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i) {
        std::vector<double> s(static_cast<size_t>(Lk), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < Lk; ++j) {
          if (!allowed(b, h, i, j)) continue;
          double d = 0;
          for (int64_t c = 0; c < hd; ++c)
            d += proj(xq, 0, b, i, h * hd + c) * proj(xk, E, b, j, h * hd + c);
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < Lk; ++j) sum += s[j] == -INFINITY ? 0 : std::exp(s[j] - mx);
        for (int64_t j = 0; j < Lk; ++j) {
          const double p = s[j] == -INFINITY ? 0 : std::exp(s[j] - mx) / sum;
          r.weights.set({b, h, i, j}, p);
          for (int64_t c = 0; c < hd; ++c)
            heads.set({b, i, h * hd + c},
                      heads.at({b, i, h * hd + c}) + p * proj(xv, 2 * E, b, j, h * hd + c));
        }
      }
  r.out = Tensor::zeros({B, Lq, E}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t o = 0; o < E; ++o) {
        double s = bo.at({o});
        for (int64_t e = 0; e < E; ++e) s += heads.at({b, i, e}) * Wo.at({o, e});
        r.out.set({b, i, o}, s);
      }
  return r;
}

MultiHeadAttentionOptions f64_options(int64_t E, int64_t H) {
  MultiHeadAttentionOptions o;
  o.embed_dim = E;
  o.num_heads = H;
  o.batch_first = true;
  o.dtype = DType::f64;
  return o;
}

// Non-zero biases so that their gradients and values matter.
void randomise_biases(MultiHeadAttention& m, uint64_t seed) {
  for (auto& p : m.named_parameters()) {
    if (p.name.find("bias") != std::string::npos)
      p.value.copy_from(random_tensor(p.value.shape(), seed++, DType::f64, -0.5, 0.5));
  }
}

TEST(MultiHeadAttention, MatchesDirectFormulaWithMasks) {
  manual_seed(1);
  MultiHeadAttention m(f64_options(8, 2));
  randomise_biases(m, 50);
  const int64_t B = 2, Lq = 3, Lk = 5;
  const Tensor xq = random_tensor({B, Lq, 8}, 1), xk = random_tensor({B, Lk, 8}, 2),
               xv = random_tensor({B, Lk, 8}, 3);
  // key_padding_mask: batch 1 pads its last two keys; attn_mask forbids (i=0, j=1).
  Tensor kpm = Tensor::zeros({B, Lk}, DType::boolean);
  kpm.set({1, 3}, 1);
  kpm.set({1, 4}, 1);
  Tensor am = Tensor::zeros({Lq, Lk}, DType::boolean);
  am.set({0, 1}, 1);
  AttentionMasks masks{.key_padding_mask = kpm,
                       .attn_mask = am,
                       .need_weights = true,
                       .average_attn_weights = false};
  const MhaOutput got = m.forward(xq, xk, xv, masks);
  const Naive want = naive_mha(m, xq, xk, xv, [&](int64_t b, int64_t, int64_t i, int64_t j) {
    return !(b == 1 && j >= 3) && !(i == 0 && j == 1);
  });
  EXPECT_LT(rel_error(got.output, want.out), 1e-12);
  EXPECT_LT(rel_error(got.weights, want.weights), 1e-12);
  EXPECT_EQ(got.weights.at({1, 0, 2, 4}), 0.0);
  // Averaged weights are the mean over heads and rows sum to one.
  masks.average_attn_weights = true;
  const Tensor avg = m.forward(xq, xk, xv, masks).weights;
  ASSERT_EQ(avg.shape(), (Shape{B, Lq, Lk}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Lq; ++i) {
      double s = 0;
      for (int64_t j = 0; j < Lk; ++j) {
        s += avg.at({b, i, j});
        EXPECT_NEAR(avg.at({b, i, j}),
                    0.5 * (want.weights.at({b, 0, i, j}) + want.weights.at({b, 1, i, j})), 1e-13);
      }
      EXPECT_NEAR(s, 1.0, 1e-13);
    }
}

TEST(MultiHeadAttention, FloatMasksEqualBoolMasks) {
  manual_seed(2);
  MultiHeadAttention m(f64_options(8, 2));
  const Tensor x = random_tensor({2, 4, 8}, 4);
  Tensor kpm = Tensor::zeros({2, 4}, DType::boolean);
  kpm.set({0, 2}, 1);
  Tensor am = Tensor::zeros({2 * 2, 4, 4}, DType::boolean);  // [B * H, L, L]
  am.set({3, 1, 0}, 1);
  const Tensor a = m.forward_self(x, {.key_padding_mask = kpm, .attn_mask = am}).output;
  Tensor kpm_f = Tensor::zeros({2, 4}, DType::f64), am_f = Tensor::zeros({4, 4, 4}, DType::f64);
  kpm_f.set({0, 2}, -INFINITY);
  am_f.set({3, 1, 0}, -INFINITY);
  const Tensor b = m.forward_self(x, {.key_padding_mask = kpm_f, .attn_mask = am_f}).output;
  EXPECT_LT(rel_error(a, b), 1e-15);
  // A finite float mask shifts the scores: the output changes.
  am_f.set({0, 0, 0}, 2.0);
  EXPECT_GT(rel_error(m.forward_self(x, {.key_padding_mask = kpm_f, .attn_mask = am_f}).output, a),
            1e-6);
}

// A bool key_padding_mask that pads the end of each row runs as key lengths (no mask read): the
// same outputs as the padding given as a float mask (the dense add path), a fully padded row included;
// a row padded in the middle still runs as a mask. f32 (the cpu kernels) and f64.
TEST(MultiHeadAttention, SuffixPaddingEqualsTheDenseMask) {
  for (const DType dt : {DType::f64, DType::f32}) {
    manual_seed(3);
    MultiHeadAttentionOptions o = f64_options(16, 2);
    o.dtype = dt;
    MultiHeadAttention m(o);
    const int64_t B = 4, L = 40;
    const Tensor x = random_tensor({B, L, 16}, 5, dt);
    const int64_t lengths[B] = {33, L, 0, 1};
    for (const bool middle : {false, true}) {
      Tensor kpm = Tensor::zeros({B, L}, DType::boolean), kpm_f = Tensor::zeros({B, L}, dt);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = lengths[b]; j < L; ++j) kpm.set({b, j}, 1), kpm_f.set({b, j}, -INFINITY);
      if (middle) kpm.set({1, 7}, 1), kpm_f.set({1, 7}, -INFINITY);
      const Tensor a = m.forward_self(x, {.key_padding_mask = kpm}).output;
      const Tensor f = m.forward_self(x, {.key_padding_mask = kpm_f}).output;
      EXPECT_LT(rel_error(a, f), dt == DType::f64 ? 1e-14 : 1e-6)
          << dtype_name(dt) << (middle ? " padded in the middle" : " suffix padding");
    }
  }
}

TEST(MultiHeadAttention, CausalIgnoresFutureInputs) {
  manual_seed(3);
  MultiHeadAttention m(f64_options(8, 4));
  Tensor x = random_tensor({1, 6, 8}, 5);
  const Tensor a = m.forward_self(x, {.is_causal = true}).output;
  for (int64_t e = 0; e < 8; ++e) x.set({0, 5, e}, 100.0);
  const Tensor b = m.forward_self(x, {.is_causal = true}).output;
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t e = 0; e < 8; ++e) EXPECT_NEAR(a.at({0, i, e}), b.at({0, i, e}), 1e-14);
  // The look-ahead mask is the same thing.
  const Tensor c = m.forward_self(x, {.attn_mask = look_ahead_mask(6)}).output;
  EXPECT_LT(rel_error(c, b), 1e-15);
}

TEST(MultiHeadAttention, StateDictNamesAsPyTorch) {
  MultiHeadAttention packed(16, 4);
  std::vector<std::string> names;
  for (auto& p : packed.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                             "out_proj.bias"}));
  EXPECT_EQ(packed.named_parameters()[0].value.shape(), (Shape{48, 16}));
  MultiHeadAttentionOptions o = f64_options(16, 4);
  o.kdim = 6;
  o.vdim = 10;
  o.num_kv_heads = 2;
  MultiHeadAttention sep(o);
  names.clear();
  for (auto& p : sep.named_parameters()) names.push_back(p.name + shape_to_string(p.value.shape()));
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj_weight[16, 16]", "k_proj_weight[8, 6]",
                                             "v_proj_weight[8, 10]", "in_proj_bias[32]",
                                             "out_proj.weight[16, 16]", "out_proj.bias[16]"}));
  EXPECT_THROW(MultiHeadAttention(10, 3), Error);
}

struct MhaCase {
  std::string name;
  MultiHeadAttentionOptions opts;
  AttentionMasks masks;
  int64_t Lq = 4, Lk = 4;
  bool self = true;
  bool train_dropout = false;
};

void run_gradcheck(const MhaCase& c) {
  SCOPED_TRACE(c.name);
  manual_seed(11);
  MultiHeadAttention m(c.opts);
  randomise_biases(m, 60);
  const int64_t B = 2, E = c.opts.embed_dim;
  const int64_t kd = c.opts.kdim ? c.opts.kdim : E, vd = c.opts.vdim ? c.opts.vdim : E;
  auto shape = [&](int64_t L, int64_t d) {
    return c.opts.batch_first ? Shape{B, L, d} : Shape{L, B, d};
  };
  if (!c.train_dropout) m.eval();
  GradProblem p;
  p.module = &m;
  if (c.self) {
    p.inputs = {{"x", random_tensor(shape(c.Lq, E), 21)}};
    p.forward = [&] {
      m.manual_seed(9);
      return m.forward_self(p.inputs[0].second, c.masks).output;
    };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{m.backward_self(dy)}; };
  } else {
    p.inputs = {{"query", random_tensor(shape(c.Lq, E), 22)},
                {"key", random_tensor(shape(c.Lk, kd), 23)},
                {"value", random_tensor(shape(c.Lk, vd), 24)}};
    p.forward = [&] {
      m.manual_seed(9);
      return m.forward(p.inputs[0].second, p.inputs[1].second, p.inputs[2].second, c.masks).output;
    };
    p.backward = [&](const Tensor& dy) {
      MhaGrads g = m.backward(dy);
      return std::vector<Tensor>{g.dquery, g.dkey, g.dvalue};
    };
  }
  gradcheck(p);
}

TEST(MultiHeadAttention, GradcheckEveryOption) {
  std::vector<MhaCase> cases;
  auto base = [](const std::string& name) {
    MhaCase c;
    c.name = name;
    c.opts = f64_options(8, 2);
    return c;
  };
  cases.push_back(base("self"));
  {
    MhaCase c = base("seq-first cross Lq != Lk");
    c.opts.batch_first = false;
    c.self = false;
    c.Lq = 3, c.Lk = 5;
    cases.push_back(c);
  }
  {
    MhaCase c = base("kdim vdim gqa");
    c.opts.kdim = 5, c.opts.vdim = 7, c.opts.num_kv_heads = 1, c.opts.num_heads = 4;
    c.self = false;
    c.Lk = 6;
    cases.push_back(c);
  }
  {
    MhaCase c = base("bool masks");
    Tensor kpm = Tensor::zeros({2, 4}, DType::boolean);
    kpm.set({1, 0}, 1);
    Tensor am = Tensor::zeros({4, 4}, DType::boolean);
    am.set({2, 3}, 1);
    c.masks = {.key_padding_mask = kpm, .attn_mask = am};
    cases.push_back(c);
  }
  {
    MhaCase c = base("float masks per head");
    c.masks.attn_mask = random_tensor({4, 4, 4}, 30);
    c.masks.attn_mask.set({1, 2, 0}, -INFINITY);
    cases.push_back(c);
  }
  {
    MhaCase c = base("causal + padding");
    Tensor kpm = Tensor::zeros({2, 4}, DType::boolean);
    kpm.set({0, 3}, 1);
    c.masks = {.key_padding_mask = kpm, .is_causal = true};
    cases.push_back(c);
  }
  {
    MhaCase c = base("attention dropout (seeded)");
    c.opts.dropout = 0.3;
    c.train_dropout = true;
    cases.push_back(c);
  }
  for (PositionScheme ps : {PositionScheme::rope, PositionScheme::rope_interleaved,
                            PositionScheme::alibi, PositionScheme::shaw, PositionScheme::t5}) {
    MhaCase c = base("position " + std::to_string(static_cast<int>(ps)));
    c.opts.position = ps;
    c.opts.max_distance = ps == PositionScheme::shaw ? 2 : 8;
    c.opts.num_buckets = 4;
    c.Lq = 5;
    c.masks.is_causal = ps == PositionScheme::alibi;
    c.masks.position_offset = ps == PositionScheme::rope ? 3 : 0;
    cases.push_back(c);
  }
  {
    MhaCase c = base("t5 + padding, cross");
    c.opts.position = PositionScheme::t5;
    c.opts.num_buckets = 6, c.opts.max_distance = 8;
    c.self = false;
    c.Lk = 6;
    c.masks.key_padding_mask = Tensor::zeros({2, 6}, DType::boolean);
    c.masks.key_padding_mask.set({0, 5}, 1);
    cases.push_back(c);
  }
  for (bool causal : {false, true}) {
    MhaCase c = base(std::string("linear attention ") + (causal ? "causal" : "non-causal"));
    c.opts.kind = AttentionKind::linear;
    c.opts.num_heads = 4, c.opts.num_kv_heads = 2;
    c.masks.is_causal = causal;
    c.masks.key_padding_mask = Tensor::zeros({2, 4}, DType::boolean);
    c.masks.key_padding_mask.set({1, 1}, 1);
    cases.push_back(c);
  }
  for (const MhaCase& c : cases) run_gradcheck(c);
}

TEST(MultiHeadAttention, LinearAttentionMatchesQuadraticFormula) {
  // One head with identity projections (q = k = v = x, out_proj = identity): the module's output
  // must be the O(L^2) formula out_i = sum_j w_ij x_j / sum_j w_ij with w_ij = phi(x_i) . phi(x_j).
  manual_seed(12);
  MultiHeadAttentionOptions o = f64_options(4, 1);
  o.kind = AttentionKind::linear;
  MultiHeadAttention m(o);
  // Identity projections and zero biases: q = k = v = x, out_proj = identity.
  Tensor eye = Tensor::zeros({12, 4}, DType::f64);
  for (int64_t r = 0; r < 12; ++r) eye.set({r, r % 4}, 1.0);
  Tensor eye4 = Tensor::zeros({4, 4}, DType::f64);
  for (int64_t r = 0; r < 4; ++r) eye4.set({r, r}, 1.0);
  m.load_state_dict({{"in_proj_weight", eye},
                     {"in_proj_bias", Tensor::zeros({12}, DType::f64)},
                     {"out_proj.weight", eye4},
                     {"out_proj.bias", Tensor::zeros({4}, DType::f64)}});
  const Tensor x = random_tensor({1, 5, 4}, 31, DType::f64, -2, 2);
  auto phi = [](double v) { return v > 0 ? v + 1 : std::exp(v); };
  for (bool causal : {false, true}) {
    const Tensor y = m.forward_self(x, {.is_causal = causal}).output;
    for (int64_t i = 0; i < 5; ++i) {
      std::vector<double> num(4, 0.0);
      double den = 0;
      for (int64_t j = 0; j < (causal ? i + 1 : 5); ++j) {
        double w = 0;
        for (int64_t c = 0; c < 4; ++c) w += phi(x.at({0, i, c})) * phi(x.at({0, j, c}));
        den += w;
        for (int64_t c = 0; c < 4; ++c) num[c] += w * x.at({0, j, c});
      }
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_NEAR(y.at({0, i, c}), num[c] / den, 1e-13) << causal << " " << i;
    }
  }
}

TEST(MultiHeadAttention, RejectsBadMasks) {
  MultiHeadAttention m(f64_options(8, 2));
  const Tensor x = random_tensor({2, 4, 8}, 40);
  EXPECT_THROW(m.forward_self(x, {.key_padding_mask = Tensor::zeros({2, 5}, DType::boolean)}),
               Error);
  EXPECT_THROW(m.forward_self(x, {.attn_mask = Tensor::zeros({3, 4, 4}, DType::boolean)}), Error);
  EXPECT_THROW(m.forward_self(random_tensor({2, 4, 6}, 41)), Error);
  EXPECT_THROW(m.backward(random_tensor({2, 4, 8}, 42)), Error);  // before forward
}

}  // namespace
}  // namespace attn::nn
