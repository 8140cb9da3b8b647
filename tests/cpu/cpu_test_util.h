// Helpers of the cpu backend's tests: every instruction set in turn, a case on the cpu backend against
// the reference (f32 and bf16 bounds).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "attention/attention_cases.h"
#include "attention_run.h"
#include "backends/cpu/attention_cpu.h"
#include "isa_test_util.h"
#include "test_util.h"

namespace attn::test {

// Runs the body once per available ISA with that ISA forced (amx-emulated included where the CPU
// has AVX2, amx where it has usable tiles); restores the default afterwards.
template <class Fn>
void for_each_isa(Fn&& body) {
  for_each_isa(
      cpu::available_isas(), [] { cpu::force_isa(std::nullopt); }, body);
}

using CpuRun = FwdBwd;

// Forward (with weights) and backward (with d(add mask) when the mask is additive) on one backend.
inline CpuRun run_backend(const Case& c, Backend backend, const Tensor& dout, int threads = 0) {
  AttentionOptions o = c.o;
  o.backend = backend;
  o.threads = threads;
  o.return_weights = true;
  CpuRun r;
  r.fwd = attention(c.q, c.k, c.v, o);
  o.return_weights = false;
  o.mask_grad = o.mask.defined() && o.mask_type == MaskType::add;
  r.grads = attention_backward(dout, c.q, c.k, c.v, r.fwd.out, r.fwd.lse, o);
  return r;
}

// A gradient's error relative to max(max |reference|, floor). The floor is the size of the terms
// that a gradient sums (e.g. scale * |k| * |dO| * |v| for dq): when they cancel exactly (one key
// per row: dS = 0 in exact arithmetic) the reference is ~1e-17 and max |reference| alone would
// measure rounding noise.
inline double grad_error(const Tensor& got, const Tensor& ref, double floor) {
  const double scale = std::max(max_abs(ref), floor);
  return scale > 0.0 ? max_abs_error(got, ref) / scale : max_abs_error(got, ref);
}

// The cpu backend on f32 inputs against the reference on the same values in f64. Inputs in [-1, 1):
// an f32 score s carries an error of at least ulp(s) / 2 whatever the kernel does, and the 1e-6
// bound is about the kernel, not about scores of 30 (q, k in [-2, 2) at D = 59 with scale 0.9 reach
// that). ALiBi slopes are scaled to <= alibi_max for the same reason: with keys far from the
// diagonal the scores sit near -slope * distance, and ulp(100) / 2 = 4e-6 already.
inline void expect_matches_reference(const CaseSpec& spec, uint64_t seed, double alibi_max = 1.0) {
  CaseSpec s32 = spec;
  s32.dtype = DType::f32;
  s32.value_range = std::min(spec.value_range, 1.0);
  SCOPED_TRACE(s32.describe());
  Case c = make_case(s32, seed);
  if (c.o.alibi_slopes.defined() && alibi_max < 1.0) {
    c.o.alibi_slopes = random_tensor({spec.Hq}, DType::f64, seed, 0.0, alibi_max);
  }
  const Case c64 = to_dtype(c, DType::f64);
  Shape out_shape = cat(spec.batch, {spec.Hq, spec.Lq, spec.Dv});
  const Tensor dout = random_tensor(out_shape, DType::f32, seed + 99, -1.0, 1.0);
  const CpuRun ref = run_backend(c64, Backend::reference, dout.to(DType::f64));
  for_each_isa([&](cpu::Isa) {
    const CpuRun got = run_backend(c, Backend::cpu, dout);
    EXPECT_EQ(got.fwd.out.dtype(), DType::f32);
    EXPECT_LE(rel_error(got.fwd.out, ref.fwd.out), kTolF32Forward);
    EXPECT_LE(rel_error(got.fwd.lse, ref.fwd.lse), kTolF32Forward);
    EXPECT_LE(rel_error(got.fwd.weights, ref.fwd.weights), kTolF32Forward);
    const double terms = max_abs(dout) * max_abs(c.v);  // |dP| scale
    const double scale = c.o.scale ? *c.o.scale : 1.0 / std::sqrt(static_cast<double>(spec.D));
    EXPECT_LE(grad_error(got.grads.dq, ref.grads.dq, scale * max_abs(c.k) * terms), kTolF32Grad);
    EXPECT_LE(grad_error(got.grads.dk, ref.grads.dk, scale * max_abs(c.q) * terms), kTolF32Grad);
    EXPECT_LE(rel_error(got.grads.dv, ref.grads.dv), kTolF32Grad);
    if (ref.grads.dmask.defined()) {
      EXPECT_LE(grad_error(got.grads.dmask, ref.grads.dmask, terms), kTolF32Grad);
    }
    if (ref.grads.dsinks.defined()) {
      EXPECT_LE(grad_error(got.grads.dsinks, ref.grads.dsinks, terms), kTolF32Grad);
    }
  });
}

// bf16 inputs on the cpu backend (every ISA) against the reference on the same bf16 values in
// double: out and weights within the bf16 output quantum 1/128 and lse within 1e-5 (the bounds of
// attention_cpu_test.cc's Bf16InputsWithEveryOption: a removed key that leaked in, a wrong ALiBi
// distance or a missed dropout costs far more than 2^-8); dq, dk, dv within twice the error of the
// portable target, which computes in f32 and rounds once (Bf16GradientsWithinTwiceTheF32PathError).
inline void expect_bf16_matches_reference(const CaseSpec& spec, uint64_t seed) {
  CaseSpec s = spec;
  s.dtype = DType::bf16;
  s.value_range = std::min(spec.value_range, 1.0);
  SCOPED_TRACE(s.describe());
  const Case c = make_case(s, seed);
  const Tensor dout =
      random_tensor(cat(s.batch, {s.Hq, s.Lq, s.Dv}), DType::bf16, seed + 99, -1, 1);
  const CpuRun ref = run_backend(to_dtype(c, DType::f64), Backend::reference, dout.to(DType::f64));
  cpu::force_isa(cpu::Isa::portable);
  const CpuRun plain = run_backend(c, Backend::cpu, dout);
  const double e_dq = rel_error(plain.grads.dq, ref.grads.dq);
  const double e_dk = rel_error(plain.grads.dk, ref.grads.dk);
  const double e_dv = rel_error(plain.grads.dv, ref.grads.dv);
  ASSERT_GT(std::min({e_dq, e_dk, e_dv}), 0.0);  // else "twice the error" would ask for exactness
  for_each_isa([&](cpu::Isa) {
    const CpuRun got = run_backend(c, Backend::cpu, dout);
    EXPECT_EQ(got.fwd.out.dtype(), DType::bf16);
    EXPECT_LE(rel_error(got.fwd.out, ref.fwd.out), 1.0 / 128);
    EXPECT_LE(rel_error(got.fwd.weights, ref.fwd.weights), 1.0 / 128);
    EXPECT_LE(rel_error(got.fwd.lse, ref.fwd.lse), 1e-5);
    EXPECT_LE(rel_error(got.grads.dq, ref.grads.dq), 2.0 * e_dq);
    EXPECT_LE(rel_error(got.grads.dk, ref.grads.dk), 2.0 * e_dk);
    EXPECT_LE(rel_error(got.grads.dv, ref.grads.dv), 2.0 * e_dv);
  });
}

}  // namespace attn::test
