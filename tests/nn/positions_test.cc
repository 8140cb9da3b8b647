// Forward values of the relative position schemes (the gradchecks prove the backwards consistent
// with these forwards; these tests prove the forwards are the published formulas).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;

TEST(Rope, RotatesPairsByPositionTimesFrequency) {
  // hd = 4, base 10000: pair 0 turns by p * 1, pair 1 by p * 10000^(-1/2) = p / 100.
  for (bool interleaved : {false, true}) {
    Tensor x = Tensor::from_vector({1, 2, 4}, {1, 2, 3, 4, 1, 2, 3, 4}, DType::f64);
    rope_rotate(x, /*offset=*/2, 10000.0, interleaved, false);
    // Positions 2 and 3. Half-split pairs (0, 2), (1, 3); interleaved (0, 1), (2, 3).
    for (int64_t l = 0; l < 2; ++l) {
      const double p = 2.0 + static_cast<double>(l);
      const int64_t a0 = 0, b0 = interleaved ? 1 : 2, a1 = interleaved ? 2 : 1, b1 = 3;
      const double va0 = interleaved ? 1 : 1, vb0 = interleaved ? 2 : 3, va1 = interleaved ? 3 : 2,
                   vb1 = 4;
      EXPECT_NEAR(x.at({0, l, a0}), va0 * std::cos(p) - vb0 * std::sin(p), 1e-15);
      EXPECT_NEAR(x.at({0, l, b0}), va0 * std::sin(p) + vb0 * std::cos(p), 1e-15);
      EXPECT_NEAR(x.at({0, l, a1}), va1 * std::cos(p / 100) - vb1 * std::sin(p / 100), 1e-15);
      EXPECT_NEAR(x.at({0, l, b1}), va1 * std::sin(p / 100) + vb1 * std::cos(p / 100), 1e-15);
    }
    // The inverse undoes it.
    rope_rotate(x, 2, 10000.0, interleaved, true);
    EXPECT_NEAR(x.at({0, 1, 3}), 4.0, 1e-14);
  }
}

TEST(Rope, ScoresDependOnlyOnRelativePosition) {
  const Tensor q = random_tensor({1, 1, 8}, 1), k = random_tensor({1, 1, 8}, 2);
  auto score = [&](int64_t pq, int64_t pk) {
    Tensor a = q.clone(), b = k.clone();
    rope_rotate(a, pq, 10000.0, false, false);
    rope_rotate(b, pk, 10000.0, false, false);
    return testing::dot(a, b);
  };
  EXPECT_NEAR(score(3, 1), score(10, 8), 1e-13);
  EXPECT_NEAR(score(0, 5), score(7, 12), 1e-13);
  EXPECT_GT(std::abs(score(3, 1) - score(3, 2)), 1e-6);
}

// A module whose q.k term is zero (W_q = W_k = 0, b_k = 0): the weights show the position bias
// alone.
std::unique_ptr<MultiHeadAttention> bias_only(PositionScheme ps, const Tensor& q_bias, int64_t E,
                                              int64_t H) {
  MultiHeadAttentionOptions o;
  o.embed_dim = E;
  o.num_heads = H;
  o.batch_first = true;
  o.dtype = DType::f64;
  o.position = ps;
  o.max_distance = ps == PositionScheme::shaw ? 2 : 16;
  o.num_buckets = 8;
  auto m = std::make_unique<MultiHeadAttention>(o);
  for (auto& p : m->named_parameters()) {
    if (p.name == "in_proj_weight") p.value.fill(0.0);
    if (p.name == "in_proj_bias") {
      p.value.fill(0.0);
      for (int64_t e = 0; e < E; ++e) p.value.set({e}, q_bias.at({e}));
    }
  }
  return m;
}

Tensor param(const Module& m, const std::string& name) {
  for (auto& p : m.named_parameters())
    if (p.name == name) return p.value;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

std::vector<double> softmax(const std::vector<double>& s) {
  double mx = -INFINITY, sum = 0;
  for (double v : s) mx = std::max(mx, v);
  std::vector<double> p(s.size());
  for (size_t j = 0; j < s.size(); ++j) sum += (p[j] = std::exp(s[j] - mx));
  for (double& v : p) v /= sum;
  return p;
}

TEST(RelativePositions, T5BiasIsTheBucketTable) {
  const int64_t E = 4, H = 2, L = 7;
  auto m = bias_only(PositionScheme::t5, Tensor::zeros({E}, DType::f64), E, H);
  Tensor table = param(*m, "relative_attention_bias.weight");
  ASSERT_EQ(table.shape(), (Shape{8, H}));
  const Tensor w = m->forward_self(random_tensor({1, L, E}, 3),
                                   {.need_weights = true, .average_attn_weights = false})
                       .weights;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(L);
      for (int64_t j = 0; j < L; ++j) s[j] = table.at({t5_relative_bucket(j - i, true, 8, 16), h});
      const std::vector<double> p = softmax(s);
      for (int64_t j = 0; j < L; ++j) EXPECT_NEAR(w.at({0, h, i, j}), p[j], 1e-14);
    }
}

TEST(RelativePositions, ShawAddsScaledQueryDotClippedTable) {
  const int64_t E = 4, H = 1, L = 6;
  const Tensor c = random_tensor({E}, 4);
  auto m = bias_only(PositionScheme::shaw, c, E, H);
  const Tensor a = param(*m, "relative_key.weight");  // [2 * 2 + 1, hd]
  ASSERT_EQ(a.shape(), (Shape{5, E}));
  const Tensor w = m->forward_self(random_tensor({1, L, E}, 5), {.need_weights = true}).weights;
  for (int64_t i = 0; i < L; ++i) {
    std::vector<double> s(L);
    for (int64_t j = 0; j < L; ++j) {
      const int64_t r = std::clamp<int64_t>(j - i, -2, 2) + 2;
      for (int64_t d = 0; d < E; ++d) s[j] += c.at({d}) * a.at({r, d}) / 2.0;  // scale 1 / sqrt(4)
    }
    const std::vector<double> p = softmax(s);
    for (int64_t j = 0; j < L; ++j) EXPECT_NEAR(w.at({0, i, j}), p[j], 1e-14);
  }
}

TEST(RelativePositions, AlibiPenalisesDistanceWithPaperSlopes) {
  const int64_t E = 8, H = 4, L = 5;
  auto m = bias_only(PositionScheme::alibi, Tensor::zeros({E}, DType::f64), E, H);
  ASSERT_EQ(m->head_slopes(), alibi_slopes(4));
  const Tensor w =
      m->forward_self(random_tensor({1, L, E}, 6),
                      {.is_causal = true, .need_weights = true, .average_attn_weights = false})
          .weights;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s;
      for (int64_t j = 0; j <= i; ++j)
        s.push_back(-m->head_slopes()[h] * static_cast<double>(i - j));
      const std::vector<double> p = softmax(s);
      for (int64_t j = 0; j < L; ++j) EXPECT_NEAR(w.at({0, h, i, j}), j <= i ? p[j] : 0.0, 1e-14);
    }
}

}  // namespace
}  // namespace attn::nn
