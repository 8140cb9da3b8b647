// The softmax's vectorised exp (vexp, src/backends/cpu/simd-inl.h) on every target this CPU runs:
// its accuracy over the whole range the kernels feed it (x <= 0 and up to 88), and its edges (0
// gives exactly 1, below -87.33 and -inf give 0, NaN stays NaN). Every probability of the forward,
// the backward's recomputed P and decode go through it, so its error is part of every result; the
// bf16 forward's P (rounded to bf16 next) goes through vexp2_for_bf16, tested below.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/kernels.h"

namespace attn::test {
namespace {

// |y - exp(x)| in units of the last place of exp(x) (float's spacing at the exact value).
double ulp_error(float x, float y) {
  const double exact = std::exp(static_cast<double>(x));
  const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
  return std::fabs(static_cast<double>(y) - exact) / ulp;
}

std::vector<float> exp_of(cpu::Isa isa, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  cpu::kernels_of(isa).exp_rows(x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

// Every float in [-87.33, 88] would be 2^31 values; every 61st one (an odd stride, so all last bits
// are visited) covers each binade densely.
std::vector<float> sweep() {
  std::vector<float> x;
  const uint32_t neg_lo = std::bit_cast<uint32_t>(-87.33f), pos_hi = std::bit_cast<uint32_t>(88.0f);
  for (uint32_t b = std::bit_cast<uint32_t>(-0.0f); b <= neg_lo; b += 61)
    x.push_back(std::bit_cast<float>(b));
  for (uint32_t b = 0; b <= pos_hi; b += 61) x.push_back(std::bit_cast<float>(b));
  while (x.size() % 16 != 0) x.push_back(0.0f);
  return x;
}

// The largest error(x[i], y[i]) over the inputs and the x where it occurs.
struct Worst {
  double error = 0;
  float x = 0;
};
template <class Error>
Worst worst_of(const std::vector<float>& x, const std::vector<float>& y, Error error) {
  Worst w;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = error(x[i], y[i]);
    if (e > w.error) w = {e, x[i]};
  }
  return w;
}

TEST(VectorExp, WithinTwoUlpOverTheRangeOnEveryTarget) {
  const std::vector<float> x = sweep();
  for (cpu::Isa isa : cpu::available_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const Worst w = worst_of(x, exp_of(isa, x), ulp_error);
    std::printf("[ vexp ] %-12s max error %.3f ulp (at x = %.9g) over %zu inputs\n",
                cpu::isa_name(isa), w.error, w.x, x.size());
    EXPECT_LE(w.error, 2.0) << "at x = " << w.x;
  }
}

TEST(VectorExp, EdgesOnEveryTarget) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {0.0f,    -0.0f,  -87.33f, -87.34f, -100.0f, -kInf, nan,   88.0f,
                          -1e-30f, 1e-30f, -0.5f,   0.5f,    -1.0f,   1.0f,  -2.0f, 2.0f};
  for (cpu::Isa isa : cpu::available_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const std::vector<float> y = exp_of(isa, x);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 1.0f);
    EXPECT_GT(y[2], 0.0f);  // the smallest input that is not flushed: a normal float
    EXPECT_EQ(y[3], 0.0f);
    EXPECT_EQ(y[4], 0.0f);
    EXPECT_EQ(y[5], 0.0f);
    EXPECT_TRUE(std::isnan(y[6]));
    EXPECT_TRUE(std::isfinite(y[7]));
    EXPECT_EQ(y[8], 1.0f);
    EXPECT_EQ(y[9], 1.0f);
    for (size_t i = 10; i < x.size(); ++i) EXPECT_LE(ulp_error(x[i], y[i]), 1.0) << x[i];
  }
}

// vexp2_for_bf16, the softmax's 2^x where P is rounded to bf16 next: relative error against exp2
// in double over every 61st float of [-126, 0] and a little above (the row max can give x slightly
// over 0), then its edges. 2.8e-6 fitted (degree 4); bf16's own rounding is 2^-9 = 2e-3.
std::vector<float> exp2_of(cpu::Isa isa, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  cpu::kernels_of(isa).exp2_rows_for_bf16(x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

TEST(VectorExp2ForBf16, RelativeErrorBelow3e6OverTheRangeOnEveryTarget) {
  std::vector<float> x;
  const uint32_t lo = std::bit_cast<uint32_t>(-126.0f);
  for (uint32_t b = std::bit_cast<uint32_t>(-0.0f); b <= lo; b += 61)
    x.push_back(std::bit_cast<float>(b));
  for (float v = 0.0f; v < 0.01f; v += 1e-5f) x.push_back(v);
  while (x.size() % 16 != 0) x.push_back(0.0f);
  for (cpu::Isa isa : cpu::available_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const Worst w = worst_of(x, exp2_of(isa, x), [](float xi, float yi) {
      const double exact = std::exp2(static_cast<double>(xi));
      return std::fabs(static_cast<double>(yi) - exact) / exact;
    });
    std::printf("[ vexp2 for bf16 ] %-12s max relative error %.3g (at x = %.9g) over %zu inputs\n",
                cpu::isa_name(isa), w.error, w.x, x.size());
    EXPECT_LE(w.error, 3e-6) << "at x = " << w.x;
  }
}

TEST(VectorExp2ForBf16, EdgesOnEveryTarget) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {0.0f,     -0.0f,   -126.0f, -126.01f, -150.0f, -kInf,   nan,   -1.0f,
                          -0.4999f, 0.4999f, -0.5f,   -10.25f,  -64.0f,  -1e-30f, -2.0f, -3.5f};
  for (cpu::Isa isa : cpu::available_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const std::vector<float> y = exp2_of(isa, x);
    EXPECT_EQ(y[0], 1.0f);  // the polynomial's constant is 1
    EXPECT_EQ(y[1], 1.0f);
    EXPECT_GE(y[2], std::numeric_limits<float>::min());  // the last input kept: a normal float
    EXPECT_EQ(y[3], 0.0f);
    EXPECT_EQ(y[4], 0.0f);
    EXPECT_EQ(y[5], 0.0f);
    EXPECT_TRUE(std::isnan(y[6]));
    for (size_t i = 7; i < x.size(); ++i) {
      EXPECT_NEAR(y[i] / std::exp2(static_cast<double>(x[i])), 1.0, 3e-6) << x[i];
    }
  }
}

// The 16-lane targets split x into n = round(x) and r = x - n in two ways: VREDUCEPS on AVX-512
// (avx512, avx512bf16, amx), the 1.5 * 2^23 trick on the emulation (amx-emulated, AVX2); both round
// to nearest even, so every result must be the same bits, ties (k + 1/2) included. The bf16 forward
// on AMX hardware and on the emulation gives the same bits through this (amx_pipeline_test.cc).
TEST(VectorExp2ForBf16, SameBitsOnEverySixteenLaneTarget) {
  std::vector<float> x;
  for (int k = 0; k <= 126; ++k) {
    for (float f : {0.5f, 0.25f, 0.75f, 0.0f, 0.49999997f, 0.50000006f}) x.push_back(-(k + f));
  }
  const uint32_t lo = std::bit_cast<uint32_t>(-127.0f);
  for (uint32_t b = std::bit_cast<uint32_t>(-0.0f); b <= lo; b += 997)
    x.push_back(std::bit_cast<float>(b));
  for (float v = 0.0f; v < 0.01f; v += 1e-5f) x.push_back(v);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  while (x.size() % 16 != 0) x.push_back(-0.5f);
  std::vector<cpu::Isa> wide;
  for (cpu::Isa isa :
       {cpu::Isa::amx_emulated, cpu::Isa::avx512, cpu::Isa::avx512bf16, cpu::Isa::amx}) {
    if (cpu::isa_available(isa)) wide.push_back(isa);
  }
  if (wide.size() < 2) GTEST_SKIP() << "fewer than two 16-lane targets on this CPU";
  const std::vector<float> first = exp2_of(wide.front(), x);
  for (size_t t = 1; t < wide.size(); ++t) {
    SCOPED_TRACE(cpu::isa_name(wide[t]));
    const std::vector<float> y = exp2_of(wide[t], x);
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      differ += std::bit_cast<uint32_t>(y[i]) != std::bit_cast<uint32_t>(first[i]);
    }
    EXPECT_EQ(differ, 0) << "of " << x.size() << " inputs, against " << cpu::isa_name(wide.front());
  }
}

}  // namespace
}  // namespace attn::test
