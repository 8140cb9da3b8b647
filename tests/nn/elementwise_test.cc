// The vectorised f32 element-wise kernels (src/nn/elementwise.h) against double references on every
// instruction set this CPU has: erf and the activations over the whole f32 range (max errors in
// ulps printed), the tails, denormals, infinities and NaN, lengths that are not a multiple of the
// vector width; LayerNorm fused with the residual add against the unfused op and against f64.
#include "nn/elementwise.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "attn/threads.h"
#include "nn/ew_test_util.h"
#include "nn/nn_test_util.h"
#include "nn/ops.h"

namespace attn::nn {
namespace {

using testing::random_tensor;
using testing::rel_error;

// Runs body() with the kernels forced to each instruction set in turn.
template <class F>
void for_each_isa(F&& body) {
  testing::for_each_ew_isa(body);
}

// The spacing of floats at |v| (2^-149 among the denormals).
double ulp(double v) {
  v = std::abs(v);
  if (v < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
  return std::ldexp(1.0, std::ilogb(v) - 23);
}

// Sample inputs: every 2053rd float in [-lim, lim] (denormals to the ends), a dense grid over
// [-10, 10] and the pieces' seams, and the special values.
std::vector<float> sweep(float lim) {
  std::vector<float> v;
  const uint32_t top = std::bit_cast<uint32_t>(lim);
  for (uint32_t b = 0; b <= top; b += 2053) {
    v.push_back(std::bit_cast<float>(b));
    v.push_back(-std::bit_cast<float>(b));
  }
  for (int i = -100000; i <= 100000; ++i) v.push_back(static_cast<float>(i) * 1e-4f);
  for (float s : {0.70710678f, 0.5f, 14.99f, 15.0f, 10.6f, 125.0f}) {
    float a = s, b = s;
    for (int k = 0; k < 64; ++k) {
      a = std::nextafter(a, 0.0f);
      b = std::nextafter(b, 100.0f);
      for (float x : {a, b, -a, -b}) v.push_back(x);
    }
  }
  return v;
}

// Double references, written to stay accurate in the tails (erfc, not 1 + erf; sigmoid of -|v|).
double sigmoid(double v) {
  return v >= 0 ? 1.0 / (1.0 + std::exp(-v)) : std::exp(v) / (1.0 + std::exp(v));
}
constexpr double kK1 = 1.5957691216057308, kK3 = 1.5957691216057308 * 0.044715;  // 2 sqrt(2/pi)
constexpr double kInvSqrt2 = 0.70710678118654752440, kInvSqrt2Pi = 0.39894228040143267794;

// f(x) and the sum of the magnitudes of the terms of f'(x) (the scale its rounding error has).
struct Ref {
  double f, df, df_scale;
};
Ref reference(Activation a, double x) {
  switch (a) {
    case Activation::relu:
      return {x > 0 ? x : 0.0, x > 0 ? 1.0 : 0.0, 1.0};
    case Activation::gelu: {
      const double phi = 0.5 * std::erfc(-x * kInvSqrt2),
                   dens = x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
      return {x * phi, phi + dens, std::abs(phi) + std::abs(dens)};
    }
    case Activation::gelu_tanh:
    case Activation::silu: {
      const bool t = a == Activation::gelu_tanh;
      const double v = t ? x * (kK1 + kK3 * x * x) : x, vp = t ? kK1 + 3 * kK3 * x * x : 1.0;
      const double s = sigmoid(v), g = x * vp * s * sigmoid(-v);
      return {x * s, s + g, std::abs(s) + std::abs(g)};
    }
  }
  return {};
}

constexpr Activation kActs[] = {Activation::relu, Activation::gelu, Activation::gelu_tanh,
                                Activation::silu};

TEST(Elementwise, ErfWithinOneUlp) {
  const std::vector<float> x = sweep(12.0f);
  for_each_isa([&](cpu::Isa isa) {
    std::vector<float> y(x.size());
    ew::erf(x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0, at = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = std::erf(static_cast<double>(x[i]));
      const double e = std::abs(y[i] - ref) / ulp(ref);
      if (e > worst) worst = e, at = x[i];
    }
    std::printf("[ erf %-8s] max error %.2f ulp (at x = %.9g), %zu inputs\n", cpu::isa_name(isa),
                worst, at, x.size());
    EXPECT_LE(worst, 1.0) << "at x = " << at;
  });
}

// Forward within `fwd_ulps` of f; backward within `bwd_ulps` of the scale of f''s terms (f' itself
// has a zero, where no relative bound holds: GELU' at x = -0.75).
void check_activation(Activation a, double fwd_ulps, double bwd_ulps) {
  const std::vector<float> x = sweep(a == Activation::relu ? 1e30f : 3e4f);
  const int64_t n = static_cast<int64_t>(x.size());
  for_each_isa([&](cpu::Isa isa) {
    std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
    ew::act_forward(a, x.data(), y.data(), n);
    ew::act_backward(a, x.data(), ones.data(), dx.data(), n);
    double wf = 0, wb = 0, af = 0, ab = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const Ref r = reference(a, x[i]);
      const double ef = std::abs(y[i] - r.f) / ulp(r.f);
      const double eb = std::abs(dx[i] - r.df) / ulp(r.df_scale);
      if (ef > wf) wf = ef, af = x[i];
      if (eb > wb) wb = eb, ab = x[i];
    }
    std::printf(
        "[ %-9s %-8s] forward max %.2f ulp (x = %.9g), backward max %.2f ulp of its terms "
        "(x = %.9g)\n",
        activation_name(a), cpu::isa_name(isa), wf, af, wb, ab);
    EXPECT_LE(wf, fwd_ulps) << "forward at x = " << af;
    EXPECT_LE(wb, bwd_ulps) << "backward at x = " << ab;
  });
}

TEST(Elementwise, GeluWithinOneUlp) {
  check_activation(Activation::gelu, 1.0, 1.0);
}
TEST(Elementwise, GeluTanhWithinOneUlp) {
  check_activation(Activation::gelu_tanh, 1.0, 1.0);
}
TEST(Elementwise, SiluWithinOneUlp) {
  check_activation(Activation::silu, 1.0, 1.0);
}
TEST(Elementwise, ReluExact) {
  check_activation(Activation::relu, 0.0, 0.0);
}

TEST(Elementwise, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float den = 1e-40f;  // a denormal: GELU(x) = x / 2, erf(x) = 2 x / sqrt(pi) to round-off
  const std::vector<float> x = {inf, -inf, nan, -nan, 0.0f, -0.0f, den, -den, -30.0f, 30.0f};
  for_each_isa([&](cpu::Isa) {
    std::vector<float> e(x.size());
    ew::erf(x.data(), e.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(e[0], 1.0f);
    EXPECT_EQ(e[1], -1.0f);
    EXPECT_TRUE(std::isnan(e[2]) && std::isnan(e[3]));
    EXPECT_EQ(e[6], static_cast<float>(den * 1.1283791670955126));
    for (Activation a : kActs) {
      SCOPED_TRACE(activation_name(a));
      std::vector<float> y(x.size()), dx(x.size()), dy(x.size(), 2.0f);
      ew::act_forward(a, x.data(), y.data(), static_cast<int64_t>(x.size()));
      ew::act_backward(a, x.data(), dy.data(), dx.data(), static_cast<int64_t>(x.size()));
      EXPECT_EQ(y[0], inf);
      EXPECT_EQ(y[1], 0.0f);
      EXPECT_TRUE(std::isnan(y[2]) && std::isnan(y[3]));
      EXPECT_EQ(dx[0], 2.0f);
      EXPECT_EQ(dx[1], 0.0f);
      EXPECT_EQ(y[4], 0.0f);
      if (a != Activation::silu) {
        EXPECT_EQ(y[8], 0.0f);  // x Phi(x) at -30 underflows
      }
      if (a == Activation::gelu) {
        EXPECT_TRUE(std::isnan(dx[2]));
        EXPECT_EQ(y[6], den / 2);
        EXPECT_EQ(y[7], -den / 2);
        EXPECT_EQ(y[9], 30.0f);
        EXPECT_EQ(dx[9], 2.0f);
        EXPECT_EQ(dx[8], 0.0f);
      }
    }
  });
}

// Lengths around the vector widths: every element equals the one a long call computes, nothing past
// n is written.
TEST(Elementwise, RemainderLengths) {
  const Tensor src = random_tensor({1000}, 7, DType::f32, -6.0, 6.0);
  const float* x = src.data_as<float>();
  for_each_isa([&](cpu::Isa) {
    for (Activation a : kActs) {
      SCOPED_TRACE(activation_name(a));
      std::vector<float> y_all(1000), d_all(1000);
      ew::act_forward(a, x, y_all.data(), 1000);
      ew::act_backward(a, x, x, d_all.data(), 1000);
      for (int64_t n : {1, 15, 17, 383, 384, 385}) {
        for (int64_t off : {0, 3}) {
          std::vector<float> y(static_cast<size_t>(n + 1), -7.0f), d(y);
          ew::act_forward(a, x + off, y.data(), n);
          ew::act_backward(a, x + off, x + off, d.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(y[i], y_all[off + i]) << "n " << n << " i " << i;
            ASSERT_EQ(d[i], d_all[off + i]) << "n " << n << " i " << i;
            ASSERT_LE(std::abs(y[i] - reference(a, x[off + i]).f),
                      4 * ulp(reference(a, x[off + i]).f));
          }
          EXPECT_EQ(y[n], -7.0f);
          EXPECT_EQ(d[n], -7.0f);
        }
      }
    }
  });
}

TEST(Elementwise, ThreadCountDoesNotChangeResults) {
  const int64_t n = 300001;
  const Tensor src = random_tensor({n}, 8, DType::f32, -5.0, 5.0);
  std::vector<float> y1(n), y2(n), d1(n), d2(n);
  set_num_threads(1);
  ew::act_forward(Activation::gelu, src.data_as<float>(), y1.data(), n);
  ew::act_backward(Activation::gelu, src.data_as<float>(), src.data_as<float>(), d1.data(), n);
  set_num_threads(2);
  ew::act_forward(Activation::gelu, src.data_as<float>(), y2.data(), n);
  ew::act_backward(Activation::gelu, src.data_as<float>(), src.data_as<float>(), d2.data(), n);
  set_num_threads(0);
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(d1, d2);
}

// The module: f32 against f64 at the DESIGN.md tolerances, and the bias + activation pass of
// FeedForward against Linear then the activation.
TEST(Elementwise, ActivationLayerAndFeedForwardMatchF64) {
  for (Activation a : kActs) {
    SCOPED_TRACE(activation_name(a));
    ActivationLayer f32(a), f64(a);
    const Tensor x = random_tensor({3, 385}, 9, DType::f64, -8.0, 8.0);
    EXPECT_LT(rel_error(f32.forward(x.to(DType::f32)), f64.forward(x)), 1e-6);
    const Tensor dy = random_tensor({3, 385}, 10);
    EXPECT_LT(rel_error(f32.backward(dy.to(DType::f32)), f64.backward(dy)), 1e-5);

    manual_seed(11);
    FeedForward ff64(17, 383, a, 0.0, DType::f64);
    FeedForward ff32(17, 383, a, 0.0, DType::f32);
    ff32.load_state_dict(ff64.state_dict());
    const Tensor h = random_tensor({5, 7, 17}, 12, DType::f64, -3.0, 3.0);
    const Tensor y32 = ff32.forward(h.to(DType::f32));
    EXPECT_LT(rel_error(y32, ff64.forward(h)), 1e-6);
    ActivationLayer act(a);
    const Tensor unfused =
        ff32.linear2.forward(act.forward(ff32.linear1.forward(h.to(DType::f32))));
    EXPECT_EQ(y32.to_vector(), unfused.to_vector());
    ff32.forward(h.to(DType::f32));
    const Tensor g = random_tensor({5, 7, 17}, 13);
    EXPECT_LT(rel_error(ff32.backward(g.to(DType::f32)), ff64.backward(g)), 1e-5);
    EXPECT_LT(rel_error(ff32.linear1.bias()->grad, ff64.linear1.bias()->grad), 1e-5);
    EXPECT_LT(rel_error(ff32.linear1.weight().grad, ff64.linear1.weight().grad), 1e-5);
  }
}

// The activations for bf16 results (gelu_forward_for_bf16, gate_forward_for_bf16: fits sized for
// bf16) against double: from every finite bf16 input with |x| <= 120 (the modules' one pass) and
// from the f32 sweep (the fused bias passes, zero bias), the rounded result within 0.55 bf16 ulp of
// the exact value (0.5 is the rounding itself; numpy's model of GELU's float operations gave 0.523).
// Results below 1e-37 in magnitude (GELU below -13, the gates' far negative tails, where the f32
// results are denormal) only need to be as small.
TEST(Elementwise, Bf16ActivationsWithinABf16RoundingOfDouble) {
  std::vector<uint16_t> x16;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isfinite(v) && std::abs(v) <= 120.0f) x16.push_back(static_cast<uint16_t>(b));
  }
  std::vector<float> xf = sweep(120.0f);
  std::erase_if(xf, [](float v) { return !(std::abs(v) <= 120.0f); });
  const std::vector<float> zero(xf.size(), 0.0f);
  for (Activation a : {Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    auto error = [a](uint16_t got, double x) {  // in bf16 ulps of f(x)
      const double want = reference(a, x).f, g = bf16_to_f32(got);
      if (std::abs(want) < 1e-37) return std::abs(g) < 1e-37 ? 0.0 : 1e9;
      return std::abs(g - want) / std::ldexp(1.0, std::ilogb(want) - 7);
    };
    for_each_isa([&](cpu::Isa isa) {
      std::vector<uint16_t> y16(x16.size()), yf(xf.size());
      ew::act_forward_bf16(a, x16.data(), y16.data(), static_cast<int64_t>(x16.size()));
      std::vector<float> h = xf;
      ew::bias_act_forward_bf16(a, h.data(), zero.data(), yf.data(), 1,
                                static_cast<int64_t>(h.size()));
      double worst = 0, at = 0;
      for (size_t i = 0; i < x16.size(); ++i) {
        const double x = bf16_to_f32(x16[i]), e = error(y16[i], x);
        if (e > worst) worst = e, at = x;
      }
      for (size_t i = 0; i < xf.size(); ++i) {
        const double e = error(yf[i], xf[i]);
        if (e > worst) worst = e, at = xf[i];
      }
      std::printf("[ %-9s bf16 %-8s] max %.3f bf16 ulp (x = %.9g), %zu bf16 and %zu f32 inputs\n",
                  activation_name(a), cpu::isa_name(isa), worst, at, x16.size(), xf.size());
      EXPECT_LE(worst, 0.55) << activation_name(a) << " " << cpu::isa_name(isa) << " at x = " << at;
    });
  }
}

// The module on bf16 x (a transposed view: not contiguous): bf16 out, the one-pass kernel's bits;
// its backward is the f32 module's on the widened x, bit for bit (f32 dx).
TEST(Elementwise, ActivationLayerOnBf16) {
  for (Activation a : kActs) {
    SCOPED_TRACE(activation_name(a));
    const Tensor x =
        random_tensor({37, 3}, 14, DType::f32, -7.0, 7.0).to(DType::bf16).transpose(0, 1);
    ActivationLayer m16(a), m32(a);
    const Tensor y = m16.forward(x);
    ASSERT_EQ(y.dtype(), DType::bf16);
    ASSERT_EQ(y.shape(), x.shape());
    const Tensor xc = x.contiguous();
    std::vector<uint16_t> want(static_cast<size_t>(x.numel()));
    ew::act_forward_bf16(a, xc.data_as<uint16_t>(), want.data(), x.numel());
    const Tensor yc = y.contiguous();
    EXPECT_EQ(std::vector<uint16_t>(yc.data_as<uint16_t>(), yc.data_as<uint16_t>() + y.numel()),
              want);
    const Tensor dy = random_tensor({3, 37}, 15);
    m32.forward(x.to(DType::f32));
    const Tensor dx = m16.backward(dy);
    ASSERT_EQ(dx.dtype(), DType::f32);
    EXPECT_EQ(dx.to_vector(), m32.backward(dy).to_vector());
  }
}

// LayerNorm(x + r): fused equals unfused bitwise, both match f64; the backward_sum likewise.
TEST(Elementwise, LayerNormFusedMatchesUnfusedAndF64) {
  for_each_isa([&](cpu::Isa) {
    for (int64_t d : {1, 15, 17, 383, 384, 385}) {
      for (int64_t rows : {3, 300}) {
        SCOPED_TRACE(::testing::Message() << "d " << d << " rows " << rows);
        manual_seed(20);
        LayerNorm n64(d, 1e-12, true, true, DType::f64);
        LayerNorm fused(d, 1e-12, true, true, DType::f32), plain(d, 1e-12, true, true, DType::f32);
        // Non-trivial weight and bias.
        const TensorList sd = {{"weight", random_tensor({d}, 21, DType::f64, 0.5, 1.5)},
                               {"bias", random_tensor({d}, 22, DType::f64, -0.5, 0.5)}};
        n64.load_state_dict(sd);
        fused.load_state_dict(sd);
        plain.load_state_dict(sd);
        // An offset mean (4) against unit spread: the statistics' cancellation is exercised.
        const Tensor x = random_tensor({rows, d}, 23, DType::f64, 3.0, 5.0).to(DType::f32);
        const Tensor r = random_tensor({rows, d}, 24, DType::f64, -1.0, 1.0).to(DType::f32);
        const Tensor s32 = detail::add(x, r);
        const Tensor y_fused = fused.forward_residual(x, r);
        const Tensor y_plain = plain.forward(s32);
        EXPECT_EQ(y_fused.to_vector(), y_plain.to_vector());
        const Tensor y64 = n64.forward(s32.to(DType::f64));
        if (d > 1) {  // d = 1: x - mean is 0 and y is the bias exactly
          EXPECT_LT(rel_error(y_fused, y64), 1e-6);
        }
        const Tensor dy = random_tensor({rows, d}, 25, DType::f32);
        const Tensor dy2 = random_tensor({rows, d}, 26, DType::f32);
        const Tensor dx_fused = fused.backward_sum(dy, dy2);
        const Tensor dx_plain = plain.backward(detail::add(dy, dy2));
        EXPECT_EQ(dx_fused.to_vector(), dx_plain.to_vector());
        const Tensor dx64 = n64.backward(detail::add(dy, dy2).to(DType::f64));
        if (d > 1) {
          EXPECT_LT(rel_error(dx_fused, dx64), 1e-5);
        }
        const auto pf = fused.named_parameters(), pp = plain.named_parameters(),
                   p64 = n64.named_parameters();
        for (size_t i = 0; i < pf.size(); ++i) {
          EXPECT_EQ(pf[i].grad.to_vector(), pp[i].grad.to_vector()) << pf[i].name;
          EXPECT_LT(rel_error(pf[i].grad, p64[i].grad), 1e-5) << pf[i].name;
        }
        EXPECT_EQ(pf.size(), 2u);
      }
    }
  });
}

// bf16 rows widened and rounded inside the LayerNorm pass: the bits of converting whole tensors
// before and after (tails, every rounding case, inf and NaN rows), for a bf16 module and for an f32
// module given bf16 inputs (whose backward then sees the same xhat).
TEST(Elementwise, LayerNormBf16RowsEqualConvertedTensors) {
  for_each_isa([&](cpu::Isa) {
    for (int64_t d : {1, 15, 17, 383, 384}) {
      SCOPED_TRACE(::testing::Message() << "d " << d);
      const int64_t rows = 300;  // several tasks of the fixed-size chunks
      manual_seed(30);
      LayerNorm n16(d, 1e-12, true, true, DType::bf16), n32(d, 1e-12, true, true, DType::f32),
          ref(d, 1e-12, true, true, DType::f32);
      const TensorList sd = {{"weight", random_tensor({d}, 31, DType::f32, 0.5, 1.5)},
                             {"bias", random_tensor({d}, 32, DType::f32, -0.5, 0.5)}};
      for (LayerNorm* n : {&n16, &n32, &ref}) n->load_state_dict(sd);
      Tensor x = random_tensor({rows, d}, 33, DType::f32, -3.0, 5.0).to(DType::bf16);
      const Tensor r = random_tensor({rows, d}, 34, DType::f32, -1.0, 1.0).to(DType::bf16);
      uint16_t* xb = x.data_as<uint16_t>();
      xb[7 * d] = 0x7f80;          // +inf: row 7 becomes NaN
      xb[9 * d + d - 1] = 0x7fc1;  // NaN in the last element of row 9
      const Tensor xf = x.to(DType::f32), rf = r.to(DType::f32);
      // The weights as the bf16 module holds them (rounded), for its f32 reference.
      LayerNorm ref16(d, 1e-12, true, true, DType::f32);
      ref16.load_state_dict(n16.state_dict());
      const Tensor want16 = ref16.forward(detail::add(xf, rf)).to(DType::bf16);
      const Tensor got16 = n16.forward_residual(x, r);
      ASSERT_EQ(got16.dtype(), DType::bf16);
      const auto gb = got16.data_as<uint16_t>(), wb = want16.data_as<uint16_t>();
      for (int64_t i = 0; i < rows * d; ++i) ASSERT_EQ(gb[i], wb[i]) << "element " << i;
      EXPECT_NE(gb[7 * d] & 0x7fffu, 0x7f80u);  // the inf row's results are NaN (quiet), not inf
      EXPECT_GT(gb[7 * d] & 0x7fffu, 0x7f80u);
      // The f32 module on bf16 inputs equals it on their widened copies, forward and backward.
      const Tensor y = n32.forward_residual(x, r), y_ref = ref.forward_residual(xf, rf);
      ASSERT_EQ(y.dtype(), DType::f32);
      const auto yv = y.to_vector(), yr = y_ref.to_vector();
      for (size_t i = 0; i < yv.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint64_t>(yv[i]), std::bit_cast<uint64_t>(yr[i])) << i;
      const Tensor dy = random_tensor({rows, d}, 35, DType::f32);
      const auto dx = n32.backward(dy).to_vector(), dx_ref = ref.backward(dy).to_vector();
      for (size_t i = 0; i < dx.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint64_t>(dx[i]), std::bit_cast<uint64_t>(dx_ref[i])) << i;
    }
  });
}

// The bf16 conversions of the kernels (whole tensors, and a GEMM's f32 rows plus bias rounded once)
// against dtype.h's scalar ones, bit for bit, on every ISA: ties both ways, values rounding to inf,
// inf, NaN (quieted), subnormals, random bit patterns, lengths with vector tails, several tasks.
TEST(Elementwise, Bf16ConversionsMatchTheScalarOnes) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u,
                                0xffc00000u, 0x00000001u, 0x807fffffu, 0x3f7fffffu};
  uint32_t s = 777;
  while (bits.size() < 100003) bits.push_back(s = s * 1664525u + 1013904223u);
  const int64_t n = static_cast<int64_t>(bits.size());
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = std::bit_cast<float>(bits[i]);
  for_each_isa([&](cpu::Isa) {
    std::vector<uint16_t> h(f.size());
    ew::round_bf16(f.data(), h.data(), n);
    std::vector<float> back(f.size());
    ew::widen_bf16(h.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], f32_to_bf16(f[i])) << "bits " << std::hex << bits[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), static_cast<uint32_t>(h[i]) << 16) << i;
    }
    // Rows of a GEMM's result with a bias (and without): bf16(y + b), one rounding.
    for (const int64_t cols : {1, 17, 383}) {
      const int64_t rows = n / cols;
      std::vector<float> b(static_cast<size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) b[j] = f[(j * 7919) % n];
      for (const bool bias : {true, false}) {
        std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
        ew::bias_round_bf16(f.data(), bias ? b.data() : nullptr, out.data(), rows, cols);
        for (int64_t i = 0; i < rows * cols; ++i) {
          const float want = bias ? f[i] + b[i % cols] : f[i];
          if (std::isnan(want)) {  // NaN + NaN: which payload survives is the compiler's choice
            ASSERT_GT(out[i] & 0x7fffu, 0x7f80u) << "cols " << cols << " element " << i;
            continue;
          }
          ASSERT_EQ(out[i], f32_to_bf16(want)) << "cols " << cols << " element " << i;
        }
      }
    }
  });
}

// Whether the bf16 v is the rounding of the f32 result y of the f32 kernels (within 0.65 f32 ulp of
// the exact value): bitwise for ReLU; GELU, SiLU and tanh-GELU, evaluated in float lanes for bf16
// results, within 0.6 bf16 ulp of y (forward: at most 0.53 against double, see
// Bf16ActivationsWithinABf16RoundingOfDouble; GELU's backward, measured over 2M points on [-13, 14]:
// 0.58, where a difference of two near-equal terms magnifies float's round-off), and below 1e-37 in
// magnitude where y is (GELU below x = -13 is returned as -0).
bool rounds_to(uint16_t v, float y, Activation a) {
  if (a == Activation::relu) return v == f32_to_bf16(y);
  const double got = bf16_to_f32(v), want = y;
  if (std::isnan(want) || std::isinf(want)) return v == f32_to_bf16(y);
  if (std::abs(want) < 1e-37) return std::abs(got) < 1e-37;
  return std::abs(got - want) <= 0.6 * std::ldexp(1.0, std::ilogb(want) - 7);
}

// The bf16 FFN's fused pass: bf16(f(h + b)) kept in f32 rows is the f32 pass rounded (rounds_to:
// float lanes but ReLU), for every activation, ISA and row length (a tail that is not a whole vector).
TEST(Elementwise, BiasActivationRoundedToBf16) {
  for (const int64_t cols : {1, 17, 384}) {
    const int64_t rows = 37;
    const Tensor src = random_tensor({rows, cols}, 9, DType::f32, -6.0, 6.0);
    const Tensor bias = random_tensor({cols}, 10, DType::f32, -1.0, 1.0);
    for_each_isa([&](cpu::Isa isa) {
      for (Activation a : kActs) {
        std::vector<float> h(src.data_as<float>(), src.data_as<float>() + rows * cols), y(h.size());
        std::vector<float> r = h;
        ew::bias_act_forward(a, h.data(), bias.data_as<float>(), y.data(), rows, cols);
        ew::bias_act_round_bf16(a, r.data(), bias.data_as<float>(), rows, cols);
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(r[i]) & 0xffffu, 0u) << "a bf16 value, at " << i;
          ASSERT_TRUE(
              rounds_to(static_cast<uint16_t>(std::bit_cast<uint32_t>(r[i]) >> 16), y[i], a))
              << activation_name(a) << " " << cpu::isa_name(isa) << " cols " << cols << " at " << i;
        }
      }
    });
  }
}

// Autocast's FFN passes: bias + activation with a bf16 output (the pre-activation kept in h) is the
// f32 pass rounded (rounds_to); the backward from bf16 dy is the f32 backward of the widened dy rounded,
// and its bias sums are the column sums of the f32 products (to f32 round-off), for every activation,
// ISA and row length; the sums do not depend on the thread count.
TEST(Elementwise, AutocastActivationPasses) {
  for (const int64_t cols : {1, 17, 384}) {
    const int64_t rows = 300;
    const Tensor src = random_tensor({rows, cols}, 9, DType::f32, -6.0, 6.0);
    const Tensor bias = random_tensor({cols}, 10, DType::f32, -1.0, 1.0);
    const Tensor dy = random_tensor({rows, cols}, 11, DType::bf16);
    const std::vector<double> dyd = dy.to_vector();
    const std::vector<float> dyf(dyd.begin(), dyd.end());
    for_each_isa([&](cpu::Isa isa) {
      for (Activation a : kActs) {
        std::vector<float> h(src.data_as<float>(), src.data_as<float>() + rows * cols), y(h.size());
        std::vector<float> h2 = h;
        std::vector<uint16_t> y16(h.size());
        ew::bias_act_forward(a, h.data(), bias.data_as<float>(), y.data(), rows, cols);
        ew::bias_act_forward_bf16(a, h2.data(), bias.data_as<float>(), y16.data(), rows, cols);
        ASSERT_EQ(h, h2) << "the pre-activation, " << activation_name(a);
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_TRUE(rounds_to(y16[i], y[i], a))
              << activation_name(a) << " " << cpu::isa_name(isa) << " cols " << cols << " at " << i
              << ": " << bf16_to_f32(y16[i]) << " for " << y[i];
        }
        std::vector<float> dx(h.size()), db(static_cast<size_t>(cols), 0.5f),
            db1(static_cast<size_t>(cols), 0.5f);
        std::vector<uint16_t> dx16(h.size());
        ew::act_backward(a, h.data(), dyf.data(), dx.data(), rows * cols);
        ew::act_backward_bf16(a, h.data(), dy.data_as<uint16_t>(), dx16.data(), db.data(), rows,
                              cols);
        set_num_threads(1);
        std::vector<uint16_t> unused(h.size());
        ew::act_backward_bf16(a, h.data(), dy.data_as<uint16_t>(), unused.data(), db1.data(), rows,
                              cols);
        set_num_threads(0);
        EXPECT_EQ(db, db1) << "thread count";
        // The bias sums of bf16 rows alone (autocast's other products).
        std::vector<float> cs(static_cast<size_t>(cols), 0.25f), cs1 = cs;
        ew::column_sums_bf16(dy.data_as<uint16_t>(), rows, cols, cs.data());
        set_num_threads(1);
        ew::column_sums_bf16(dy.data_as<uint16_t>(), rows, cols, cs1.data());
        set_num_threads(0);
        EXPECT_EQ(cs, cs1) << "thread count";
        for (int64_t c = 0; c < cols; ++c) {
          double want = 0.25;
          for (int64_t r = 0; r < rows; ++r) want += dyd[static_cast<size_t>(r * cols + c)];
          ASSERT_NEAR(cs[c], want, 1e-5 * rows) << cpu::isa_name(isa) << " column " << c;
        }
        for (size_t i = 0; i < dx.size(); ++i) {
          ASSERT_TRUE(rounds_to(dx16[i], dx[i], a))
              << activation_name(a) << " " << cpu::isa_name(isa) << " at " << i << ": "
              << bf16_to_f32(dx16[i]) << " for " << dx[i];
        }
        for (int64_t c = 0; c < cols; ++c) {
          double s = 0.5, mag = 0;
          for (int64_t r = 0; r < rows; ++r)
            s += dx[r * cols + c], mag += std::abs(dx[r * cols + c]);
          ASSERT_NEAR(db[c], s, 4e-6 * (mag + 1)) << activation_name(a) << " column " << c;
        }
      }
    });
  }
}

// The bf16 passes' special values: f(+inf) = +inf, f(-inf) = -0, NaN stays NaN; f'(+inf) = 1,
// f'(-inf) = 0 (every activation, every ISA, through the vector body and the tail).
TEST(Elementwise, AutocastActivationPassesSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::vector<float> x = {inf, -inf, nan, 0.0f, -20.0f, 20.0f, 1.0f, -1.0f, inf, -inf, nan};
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> zero(x.size(), 0.0f);
  const std::vector<uint16_t> ones(x.size(), f32_to_bf16(1.0f));
  for_each_isa([&](cpu::Isa isa) {
    for (Activation a : kActs) {
      std::vector<float> h = x;
      std::vector<uint16_t> y(x.size()), dx(x.size());
      ew::bias_act_forward_bf16(a, h.data(), zero.data(), y.data(), 1, n);
      ew::act_backward_bf16(a, x.data(), ones.data(), dx.data(), nullptr, 1, n);
      for (int64_t i : {0, 8}) {
        EXPECT_EQ(bf16_to_f32(y[i]), inf) << activation_name(a) << " " << cpu::isa_name(isa);
        EXPECT_EQ(bf16_to_f32(dx[i]), 1.0f) << activation_name(a) << " " << cpu::isa_name(isa);
      }
      for (int64_t i : {1, 9}) {
        EXPECT_EQ(bf16_to_f32(y[i]), 0.0f) << activation_name(a) << " " << cpu::isa_name(isa);
        EXPECT_EQ(bf16_to_f32(dx[i]), 0.0f) << activation_name(a) << " " << cpu::isa_name(isa);
      }
      for (int64_t i : {2, 10}) EXPECT_TRUE(std::isnan(bf16_to_f32(y[i]))) << activation_name(a);
    }
  });
}

// The bf16 activation modules' one pass from bf16 x: the f32 kernel on the widened x, rounded
// (rounds_to: float lanes but ReLU), for every activation and ISA, at lengths that end inside the
// whole-register body, its half-register tail and a partial vector; special values (+-inf, NaN, -0,
// a bf16 denormal) among them; and in place (y = x) the same bits.
TEST(Elementwise, Bf16ActivationForwardIsTheF32OneRounded) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (const int64_t n : {1, 15, 47, 1000}) {
    const Tensor src = random_tensor({n}, 12, DType::f32, -9.0, 7.0).to(DType::bf16);
    std::vector<uint16_t> x(src.data_as<uint16_t>(), src.data_as<uint16_t>() + n);
    const float specials[] = {inf, -inf, nan, -0.0f, 1e-39f, -14.0f};
    for (size_t s = 0; s < std::size(specials); ++s) {
      if (static_cast<int64_t>(3 * s + 2) < n) x[3 * s + 2] = f32_to_bf16(specials[s]);
    }
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
    for_each_isa([&](cpu::Isa isa) {
      for (Activation a : kActs) {
        std::vector<float> y(xf.size());
        std::vector<uint16_t> y16(x.size()), in_place = x;
        ew::act_forward(a, xf.data(), y.data(), n);
        ew::act_forward_bf16(a, x.data(), y16.data(), n);
        ew::act_forward_bf16(a, in_place.data(), in_place.data(), n);
        ASSERT_EQ(in_place, y16) << activation_name(a) << " in place";
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_TRUE(rounds_to(y16[i], y[i], a))
              << activation_name(a) << " " << cpu::isa_name(isa) << " n " << n << " at " << i
              << ": " << bf16_to_f32(y16[i]) << " for " << y[i] << " (x " << xf[i] << ")";
        }
      }
    });
  }
}

TEST(Elementwise, LayerNormResidualShapeChecked) {
  LayerNorm n(8);
  const Tensor x = Tensor::zeros({2, 8}, DType::f32);
  EXPECT_THROW(n.forward_residual(x, Tensor::zeros({3, 8}, DType::f32)), Error);
  EXPECT_THROW(n.forward_residual(x, Tensor::zeros({2, 4}, DType::f32)), Error);
  n.forward(x);
  EXPECT_THROW(n.backward_sum(x, Tensor::zeros({3, 8}, DType::f32)), Error);
}

}  // namespace
}  // namespace attn::nn
