// Monitors: gradient-norm warnings and per-head attention entropy.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

bool contains(const std::vector<std::string>& ws, const std::string& s) {
  for (const auto& w : ws)
    if (w.find(s) != std::string::npos) return true;
  return false;
}

TEST(GradientMonitor, FlagsVanishingExplodingAndNonFinite) {
  Linear a(3, 2, true, DType::f64), b(2, 2, false, DType::f64);
  std::vector<NamedParameter> ps = a.named_parameters();
  ps.push_back(b.named_parameters()[0]);
  ps[0].grad.fill(0.5);   // weight: 6 * 0.25 = 1.5
  ps[1].grad.fill(1e-9);  // bias: vanishing
  ps[2].grad.fill(0.0);   // exactly zero: not flagged by default
  GradNormReport r = check_gradients(ps);
  EXPECT_NEAR(r.total, std::sqrt(1.5 + 2e-18), 1e-12);
  ASSERT_EQ(r.per_parameter.size(), 3u);
  EXPECT_NEAR(r.per_parameter[1].second, std::sqrt(2.0) * 1e-9, 1e-20);
  EXPECT_EQ(r.warnings.size(), 1u);
  EXPECT_TRUE(contains(r.warnings, "vanishing gradient: bias"));
  EXPECT_TRUE(
      contains(check_gradients(ps, {.warn_zero = true}).warnings, "vanishing gradient: weight"));
  ps[0].grad.fill(1e4);
  EXPECT_TRUE(contains(check_gradients(ps).warnings, "exploding gradient"));
  ps[0].grad.set({1, 1}, NAN);
  EXPECT_TRUE(contains(check_gradients(ps).warnings, "non-finite gradient: weight"));
  ps[0].grad.fill(0.5);
  ps[1].grad.fill(0.5);
  EXPECT_TRUE(check_gradients(ps).ok());
}

TEST(EntropyMonitor, OneHotUniformAndInBetweenHeads) {
  // B = 1, H = 3, Lq = Lk = 4: head 0 one-hot, head 1 uniform, head 2 two keys at 0.5 each.
  Tensor w = Tensor::zeros({1, 3, 4, 4}, DType::f64);
  for (int64_t i = 0; i < 4; ++i) {
    w.set({0, 0, i, i}, 1.0);
    for (int64_t j = 0; j < 4; ++j) w.set({0, 1, i, j}, 0.25);
    w.set({0, 2, i, 0}, 0.5);
    w.set({0, 2, i, 1}, 0.5);
  }
  EntropyReport r = attention_entropy(w);
  ASSERT_EQ(r.heads.size(), 3u);
  EXPECT_TRUE(r.heads[0].near_one_hot);
  EXPECT_EQ(r.heads[0].normalized, 0.0);
  EXPECT_TRUE(r.heads[1].near_uniform);
  EXPECT_NEAR(r.heads[1].entropy, std::log(4.0), 1e-15);
  EXPECT_NEAR(r.heads[2].normalized, 0.5, 1e-15);  // log 2 / log 4
  EXPECT_FALSE(r.heads[2].near_one_hot || r.heads[2].near_uniform);
  EXPECT_EQ(r.warnings.size(), 2u);
  EXPECT_TRUE(contains(r.warnings, "head 0: near one-hot"));
  EXPECT_TRUE(contains(r.warnings, "head 1: near uniform"));
  // With the last two keys padded, head 2's rows are uniform over the two allowed keys.
  Tensor kpm = Tensor::zeros({1, 4}, DType::boolean);
  kpm.set({0, 2}, 1);
  kpm.set({0, 3}, 1);
  EXPECT_TRUE(attention_entropy(w, {.key_padding_mask = kpm}).heads[2].near_uniform);
  EXPECT_THROW(attention_entropy(Tensor::zeros({3, 4, 4}, DType::f64)), Error);
}

TEST(EntropyMonitor, ReadsAnEncoderLayersWeights) {
  manual_seed(3);
  TransformerEncoderLayer l(TransformerLayerOptions{
      .d_model = 16, .nhead = 4, .dim_feedforward = 16, .dropout = 0.0, .batch_first = true});
  const Tensor x = testing::random_tensor({2, 5, 16}, 1, DType::f32);
  l.forward(x, {.is_causal = true, .need_weights = true});
  ASSERT_EQ(l.attention_weights().shape(), (Shape{2, 4, 5, 5}));
  const EntropyReport r = attention_entropy(l.attention_weights(), {.causal = true});
  ASSERT_EQ(r.heads.size(), 4u);
  for (const auto& h : r.heads) {
    EXPECT_GT(h.normalized, 0.0);
    EXPECT_LE(h.normalized, 1.0 + 1e-6);
  }
}

}  // namespace
}  // namespace attn::nn
