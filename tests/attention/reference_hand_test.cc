// Small cases worked out by hand: each expected number is derived in the comment next to it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention_cases.h"
#include "contract/dropout.h"

namespace attn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

AttentionOptions reference_options() {
  AttentionOptions o;
  o.backend = Backend::reference;
  o.return_weights = true;
  return o;
}

// q [1, 1, 1], k [1, 2, 1] = (0, ln 3), v [1, 2, 1] = (4, 8), D = 1 so scale = 1.
// s = (0, ln 3) -> exp = (1, 3) -> P = (1/4, 3/4); out = 4/4 + 3*8/4 = 7; lse = log(1 + 3) = log 4.
TEST(ReferenceHand, TwoKeys) {
  const Tensor q = Tensor::from_vector({1, 1, 1}, {1.0}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 2, 1}, {0.0, std::log(3.0)}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 2, 1}, {4.0, 8.0}, DType::f64);
  const AttentionResult r = attention(q, k, v, reference_options());
  EXPECT_NEAR(r.out.at({0, 0, 0}), 7.0, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 0}), std::log(4.0), 1e-14);
  EXPECT_NEAR(r.weights.at({0, 0, 0}), 0.25, 1e-15);
  EXPECT_NEAR(r.weights.at({0, 0, 1}), 0.75, 1e-15);
}

// The same problem backwards with dout = 1: dP_j = dO.v_j = (4, 8), D = dO.O = 7,
// dS = P (dP - D) = (1/4 * -3, 3/4 * 1) = (-3/4, 3/4);
// dq = scale * sum_j dS_j k_j = 3/4 ln 3 = 0.8239592165010823; dk_j = scale dS_j q = (-3/4, 3/4);
// dv_j = P_j dO = (1/4, 3/4).
TEST(ReferenceHand, TwoKeysBackward) {
  const Tensor q = Tensor::from_vector({1, 1, 1}, {1.0}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 2, 1}, {0.0, std::log(3.0)}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 2, 1}, {4.0, 8.0}, DType::f64);
  const Tensor dout = Tensor::from_vector({1, 1, 1}, {1.0}, DType::f64);
  AttentionOptions o = reference_options();
  const AttentionResult r = attention(q, k, v, o);
  const AttentionGrads g = attention_backward(dout, q, k, v, r.out, r.lse, o);
  EXPECT_NEAR(g.dq.at({0, 0, 0}), 0.8239592165010823, 1e-14);
  EXPECT_NEAR(g.dk.at({0, 0, 0}), -0.75, 1e-14);
  EXPECT_NEAR(g.dk.at({0, 1, 0}), 0.75, 1e-14);
  EXPECT_NEAR(g.dv.at({0, 0, 0}), 0.25, 1e-15);
  EXPECT_NEAR(g.dv.at({0, 1, 0}), 0.75, 1e-15);
}

// q = 0 makes every score 0, so a row averages the v of its allowed keys. Lq = 2, Lk = 3, v = (1,
// 2, 4). bottom-right causal: p(i) = i + 1; row 0 sees keys {0, 1}: out 1.5, lse log 2; row 1 sees
// {0, 1, 2}: 7/3, log 3. top-left causal: p(i) = i; row 0 sees {0}: out 1, lse 0; row 1 sees {0,
// 1}: out 1.5, lse log 2.
TEST(ReferenceHand, CausalAlignments) {
  const Tensor q = Tensor::zeros({1, 2, 1}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 3, 1}, {0.3, -0.2, 0.9}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 3, 1}, {1.0, 2.0, 4.0}, DType::f64);
  AttentionOptions o = reference_options();
  o.causal = true;
  AttentionResult r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.at({0, 0, 0}), 1.5, 1e-14);
  EXPECT_NEAR(r.out.at({0, 1, 0}), 7.0 / 3.0, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 0}), std::log(2.0), 1e-14);
  EXPECT_NEAR(r.lse.at({0, 1}), std::log(3.0), 1e-14);
  EXPECT_EQ(r.weights.at({0, 0, 2}), 0.0);
  o.align = Align::top_left;
  r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.at({0, 0, 0}), 1.0, 1e-14);
  EXPECT_NEAR(r.out.at({0, 1, 0}), 1.5, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 0}), 0.0, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 1}), std::log(2.0), 1e-14);
}

// Window (1, 0) with Lq = Lk = 4 and q = 0: row i sees keys {i-1, i}; v = (1, 2, 4, 8) gives
// out = (1, 1.5, 3, 6) and lse = (0, log 2, log 2, log 2).
TEST(ReferenceHand, SlidingWindow) {
  const Tensor q = Tensor::zeros({1, 4, 1}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 4, 1}, {0.1, 0.2, 0.3, 0.4}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 4, 1}, {1.0, 2.0, 4.0, 8.0}, DType::f64);
  AttentionOptions o = reference_options();
  o.window = {1, 0};
  const AttentionResult r = attention(q, k, v, o);
  const double expect_out[] = {1.0, 1.5, 3.0, 6.0};
  const double expect_lse[] = {0.0, std::log(2.0), std::log(2.0), std::log(2.0)};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(r.out.at({0, i, 0}), expect_out[i], 1e-14) << "row " << i;
    EXPECT_NEAR(r.lse.at({0, i}), expect_lse[i], 1e-14) << "row " << i;
  }
}

// softcap c = 1, scale 1, q = 2, k = (1, 0): raw s = (2, 0), capped s = (tanh 2, 0) =
// (0.9640275800758169, 0); exp(tanh 2) = 2.6222365012587816, so P = (2.6222/3.6222, 1/3.6222) =
// (0.7239274686640463, 0.2760725313359536); v = (1, 0): out = 0.7239274686640463.
TEST(ReferenceHand, Softcap) {
  const Tensor q = Tensor::from_vector({1, 1, 1}, {2.0}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 2, 1}, {1.0, 0.0}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 2, 1}, {1.0, 0.0}, DType::f64);
  AttentionOptions o = reference_options();
  o.softcap = 1.0;
  o.scale = 1.0;
  const AttentionResult r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.at({0, 0, 0}), 0.7239274686640463, 1e-14);
  EXPECT_NEAR(r.weights.at({0, 0, 1}), 0.2760725313359536, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 0}), std::log(1.0 + 2.6222365012587816), 1e-14);
}

// ALiBi slope 1, Lq = 1, Lk = 3, bottom-right so p(0) = 2; q = 0: s = -|2 - j| = (-2, -1, 0);
// v = (1, 2, 3): out = (e^-2 + 2 e^-1 + 3) / (e^-2 + e^-1 + 1) = 2.5752103826044412,
// lse = log(e^-2 + e^-1 + 1) = 0.4076059644443804.
TEST(ReferenceHand, Alibi) {
  const Tensor q = Tensor::zeros({1, 1, 1}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 3, 1}, {0.5, -0.5, 0.25}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 3, 1}, {1.0, 2.0, 3.0}, DType::f64);
  AttentionOptions o = reference_options();
  o.alibi_slopes = Tensor::from_vector({1}, {1.0}, DType::f64);
  const AttentionResult r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.at({0, 0, 0}), 2.5752103826044412, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 0}), 0.4076059644443804, 1e-14);
}

// Add mask (0, ln 2, -inf) with q = 0: s = (0, ln 2, removed) -> P = (1/3, 2/3, 0); v = (3, 6,
// NaN): out = 1 + 4 = 5 (the NaN of the removed key never enters), lse = log 3.
TEST(ReferenceHand, AddMaskRemovesKeyWithNaNValue) {
  const Tensor q = Tensor::zeros({1, 1, 1}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 3, 1}, {0.5, -0.5, std::nan("")}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 3, 1}, {3.0, 6.0, std::nan("")}, DType::f64);
  AttentionOptions o = reference_options();
  o.mask = Tensor::from_vector({1, 3}, {0.0, std::log(2.0), -kInf}, DType::f64);
  o.mask_type = MaskType::add;
  const AttentionResult r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.at({0, 0, 0}), 5.0, 1e-14);
  EXPECT_NEAR(r.lse.at({0, 0}), std::log(3.0), 1e-14);
  EXPECT_EQ(r.weights.at({0, 0, 2}), 0.0);
}

// GQA: Hq = 2, Hkv = 1, D = 1, k = (0, ln 3), v = (4, 8). Head 0 has q = 1: P = (1/4, 3/4), out 7
// (as above); head 1 has q = 0: P = (1/2, 1/2), out 6. Both read the single kv head.
TEST(ReferenceHand, GroupedQueryHeadsShareKv) {
  const Tensor q = Tensor::from_vector({2, 1, 1}, {1.0, 0.0}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 2, 1}, {0.0, std::log(3.0)}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 2, 1}, {4.0, 8.0}, DType::f64);
  const AttentionResult r = attention(q, k, v, reference_options());
  EXPECT_NEAR(r.out.at({0, 0, 0}), 7.0, 1e-14);
  EXPECT_NEAR(r.out.at({1, 0, 0}), 6.0, 1e-14);
}

// Dropout p = 1/2 on one key (Lk = 1, v = 3): the weight is 1; kept -> out = 1 * 2 * 3 = 6, dropped
// -> 0. Which one happens is the keep-pattern's draw for (seed, 0, 0, 0, 0), checked against
// DropoutRule.
TEST(ReferenceHand, DropoutScalesKeptWeights) {
  const Tensor q = Tensor::zeros({1, 1, 1}, DType::f64);
  const Tensor k = Tensor::zeros({1, 1, 1}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 1, 1}, {3.0}, DType::f64);
  int kept = 0, dropped = 0;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    AttentionOptions o = reference_options();
    o.dropout_p = 0.5;
    o.seed = seed;
    const AttentionResult r = attention(q, k, v, o);
    const contract::DropoutRule rule{0.5, seed};
    const double expect = rule.keep(0, 0, 0, 0) ? 6.0 : 0.0;
    (expect == 6.0 ? kept : dropped)++;
    EXPECT_EQ(r.out.at({0, 0, 0}), expect) << "seed " << seed;
    EXPECT_EQ(r.weights.at({0, 0, 0}), 1.0);  // weights are returned before dropout
    EXPECT_EQ(r.lse.at({0, 0}), 0.0);
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(dropped, 0);
}

}  // namespace
}  // namespace attn::test
