// Learned attention sinks (AttentionOptions::sinks): one logit per query head that joins every row's
// softmax denominator and carries no value. The reference backend against the formula by hand,
// against the naive implementation (reference_crosscheck_test.cc draws sinks too), by central
// differences with dsinks among the checked gradients, at rows with no allowed key, and the errors.
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "expect_error.h"

namespace attn::test {
namespace {

// One head, one query, two keys: out = (e^{s0} v0 + e^{s1} v1) / (e^{s0} + e^{s1} + e^{sink}).
TEST(Sinks, OneRowByHand) {
  const Tensor q = Tensor::from_vector({1, 1, 1}, {1.0}, DType::f64);
  const Tensor k = Tensor::from_vector({1, 2, 1}, {0.5, -1.0}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 2, 1}, {2.0, 3.0}, DType::f64);
  AttentionOptions o;
  o.scale = 1.0;
  o.sinks = Tensor::from_vector({1}, {0.25}, DType::f64);
  o.backend = Backend::reference;
  const AttentionResult r = attention(q, k, v, o);
  const double e0 = std::exp(0.5), e1 = std::exp(-1.0), es = std::exp(0.25);
  EXPECT_NEAR(r.out.to_vector()[0], (2.0 * e0 + 3.0 * e1) / (e0 + e1 + es), 1e-15);
  EXPECT_NEAR(r.lse.to_vector()[0], std::log(e0 + e1 + es), 1e-15);
}

// A row with no allowed key: out 0, lse = the sink (not -inf), no gradient but the sink's (0: D_i
// = dO . out = 0).
TEST(Sinks, RowWithoutKeysGivesZeroAndTheSinkAsLse) {
  CaseSpec s;
  s.batch = {1}, s.Hq = 2, s.Hkv = 1, s.Lq = 3, s.Lk = 4, s.D = 2, s.Dv = 2;
  Case c = make_case(s, 4);
  c.o.sinks = Tensor::from_vector({2}, {0.5, -3.0}, DType::f64);
  c.o.key_lengths = Tensor::from_vector({1}, {0.0}, DType::i64);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend_name(backend));
    const Case cb = backend == Backend::cpu ? to_dtype(c, DType::f32) : c;
    AttentionOptions o = cb.o;
    o.backend = backend;
    const AttentionResult r = attention(cb.q, cb.k, cb.v, o);
    EXPECT_EQ(max_abs(r.out), 0.0);
    EXPECT_EQ(r.lse.to_vector(), (std::vector<double>{0.5, 0.5, 0.5, -3.0, -3.0, -3.0}));
    const Tensor G = Tensor::full(r.out.shape(), 1.0, cb.q.dtype());
    const AttentionGrads g = attention_backward(G, cb.q, cb.k, cb.v, r.out, r.lse, o);
    EXPECT_EQ(max_abs(g.dq) + max_abs(g.dk) + max_abs(g.dv) + max_abs(g.dsinks), 0.0);
  }
}

void expect_gradcheck(const CaseSpec& s, uint64_t seed, bool weights = false) {
  ASSERT_TRUE(s.sinks);
  expect_gradcheck_passes(s, seed, {weights, Backend::reference});
}

CaseSpec sink_spec() {
  CaseSpec s;
  s.batch = {2};
  s.Hq = 4, s.Hkv = 2, s.Lq = 4, s.Lk = 6, s.D = 3, s.Dv = 2;
  s.sinks = true;
  return s;
}

// dsinks (and dq, dk, dv, d(add mask)) by central differences, with the options that change the
// weights: GQA, softcap, ALiBi, causal windows, key lengths, an add mask, dropout, and the loss
// through the returned weights (dweights).
TEST(Sinks, GradientsByCentralDifferences) {
  expect_gradcheck(sink_spec(), 1);
  CaseSpec s = sink_spec();
  s.softcap = 0.9, s.alibi = true, s.causal = true, s.window = Window{2, 0};
  expect_gradcheck(s, 2);
  s = sink_spec();
  s.key_lengths = true, s.mask = MaskType::add, s.dropout = 0.3;
  expect_gradcheck(s, 3);
  expect_gradcheck(sink_spec(), 4, /*weights=*/true);
}

TEST(Sinks, BadSinksAreRefused) {
  const Case c = make_case(sink_spec(), 5);
  AttentionOptions o = c.o;
  o.sinks = Tensor::zeros({3}, DType::f64);
  expect_error([&] { (void)attention(c.q, c.k, c.v, o); }, "attn::attention",
               {"sinks must be a floating vector [Hq = 4]", "[3]"});
  o.sinks = Tensor::zeros({4}, DType::i32);
  expect_error([&] { (void)attention(c.q, c.k, c.v, o); }, "attn::attention",
               {"sinks must be a floating vector", "i32"});
  o.sinks = Tensor::from_vector({4}, {0.0, 1.0, std::nan(""), 0.0}, DType::f32);
  expect_error([&] { (void)attention(c.q, c.k, c.v, o); }, "attn::attention",
               {"sinks[2] = nan is not finite"});
}

}  // namespace
}  // namespace attn::test
