// f32 / bf16 / f16 inputs through the reference backend agree with f64 within their precision.
//
// The reference computes in double whatever the dtype, so on the SAME (rounded) inputs its only
// errors are the final rounding of out / weights to the dtype (at most one unit roundoff u relative
// to the largest element; one extra f32 rounding for the 16-bit types, since store_from_double goes
// through f32) and of lse to f32. The backward also starts from the rounded out and the f32 lse,
// which perturbs D_i = dO.O and P = exp(s - lse) by about u: its bound is a few u. Against f64 on
// the UNROUNDED inputs, f32 must meet DESIGN.md's 1e-6 (forward) and 1e-5 (gradients).
#include <gtest/gtest.h>

#include "attention_cases.h"

namespace attn::test {
namespace {

CaseSpec spec_with_options() {
  CaseSpec s;
  s.batch = {2};
  s.Hq = 4, s.Hkv = 2, s.Lq = 6, s.Lk = 9, s.D = 8, s.Dv = 5;
  s.causal = true, s.mask = MaskType::add, s.mask_shape = {6, 9}, s.alibi = true, s.softcap = 3.0;
  s.dropout = 0.1;
  return s;
}

Case converted(const Case& c, DType dt) {
  Case r = c;
  r.q = c.q.to(dt), r.k = c.k.to(dt), r.v = c.v.to(dt);
  if (dt != DType::f64 && r.o.mask.defined()) r.o.mask = c.o.mask.to(DType::f32);
  return r;
}

// lse is f32 for every dtype but f64: |error| <= u_f32 * max(1, |lse|) per element (+ the out
// rounding of the backward's inputs, not involved here).
double lse_error(const Tensor& lse, const Tensor& expected) {
  return max_abs_error(lse, expected) / std::max(1.0, max_abs(expected));
}

TEST(ReferenceDtypes, LowPrecisionInputsMatchF64OnTheSameValues) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const double u = unit_roundoff(dt);
    const double out_bound = u + kUnitRoundoffF32;  // one rounding to dt (via f32)
    for (uint64_t seed : {1, 2, 3}) {
      const Case c64 = make_case(spec_with_options(), seed);
      const Case low = converted(c64, dt);
      // The f64 problem on exactly the rounded values.
      const Case exact = converted(low, DType::f64);
      AttentionOptions o = low.o;
      o.return_weights = true;
      const AttentionResult r = attention(low.q, low.k, low.v, o);
      AttentionOptions oe = exact.o;
      oe.return_weights = true;
      const AttentionResult e = attention(exact.q, exact.k, exact.v, oe);
      EXPECT_EQ(r.out.dtype(), dt);
      EXPECT_LE(rel_error(r.out, e.out), out_bound) << dtype_name(dt);
      EXPECT_LE(max_abs_error(r.weights, e.weights), out_bound) << dtype_name(dt);
      EXPECT_LE(lse_error(r.lse, e.lse), kUnitRoundoffF32) << dtype_name(dt);

      const Tensor G64 = random_tensor(e.out.shape(), DType::f64, seed + 10);
      const Tensor G = G64.to(dt).to(DType::f64);
      AttentionOptions ob = low.o, obe = exact.o;
      ob.mask_grad = obe.mask_grad = true;
      const AttentionGrads g = attention_backward(G.to(dt), low.q, low.k, low.v, r.out, r.lse, ob);
      const AttentionGrads ge = attention_backward(G, exact.q, exact.k, exact.v, e.out, e.lse, obe);
      // Measured on these problems: at most 0.95 u (dq, dk, dv, dmask); the bound leaves room for other seeds.
      const double grad_bound = 4.0 * u;
      EXPECT_LE(rel_error(g.dq, ge.dq), grad_bound) << dtype_name(dt);
      EXPECT_LE(rel_error(g.dk, ge.dk), grad_bound) << dtype_name(dt);
      EXPECT_LE(rel_error(g.dv, ge.dv), grad_bound) << dtype_name(dt);
      EXPECT_LE(rel_error(g.dmask, ge.dmask), grad_bound) << dtype_name(dt);
      EXPECT_EQ(g.dq.dtype(), dt);
      EXPECT_EQ(g.dmask.dtype(), DType::f32);  // the mask's dtype
    }
  }
}

// DESIGN.md's tolerances for f32 against double on the unrounded inputs.
TEST(ReferenceDtypes, F32MeetsDesignTolerancesAgainstF64) {
  for (uint64_t seed : {4, 5, 6}) {
    const Case c64 = make_case(spec_with_options(), seed);
    const Case c32 = converted(c64, DType::f32);
    const AttentionResult e = attention(c64.q, c64.k, c64.v, c64.o);
    const AttentionResult r = attention(c32.q, c32.k, c32.v, c32.o);
    EXPECT_LE(rel_error(r.out, e.out), kTolF32Forward);
    EXPECT_LE(lse_error(r.lse, e.lse), kTolF32Forward);
    const Tensor G = random_tensor(e.out.shape(), DType::f64, seed);
    const AttentionGrads ge = attention_backward(G, c64.q, c64.k, c64.v, e.out, e.lse, c64.o);
    const AttentionGrads g =
        attention_backward(G.to(DType::f32), c32.q, c32.k, c32.v, r.out, r.lse, c32.o);
    EXPECT_LE(rel_error(g.dq, ge.dq), kTolF32Grad);
    EXPECT_LE(rel_error(g.dk, ge.dk), kTolF32Grad);
    EXPECT_LE(rel_error(g.dv, ge.dv), kTolF32Grad);
  }
}

// And bf16 / f16 are not silently computed in f64: their outputs are exactly representable in the
// dtype.
TEST(ReferenceDtypes, OutputsAreRoundedToTheDtype) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Case c = converted(make_case(spec_with_options(), 7), dt);
    const AttentionResult r = attention(c.q, c.k, c.v, c.o);
    const Tensor round_trip = r.out.to(DType::f64).to(dt);
    EXPECT_TRUE(bitwise_equal(round_trip, r.out));
    // Against f64 on the unrounded inputs the error is dominated by the input rounding: a few u.
    const Case c64 = make_case(spec_with_options(), 7);
    const AttentionResult e = attention(c64.q, c64.k, c64.v, c64.o);
    const double err = rel_error(r.out, e.out);
    EXPECT_LE(err, 16.0 * unit_roundoff(dt)) << dtype_name(dt);
    EXPECT_GT(err, 0.0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace attn::test
