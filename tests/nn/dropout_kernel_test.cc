// Inverted dropout's element-wise kernels (nn/elementwise.h: dropout_f32 / dropout_bf16) against the
// pattern written out here with Random123's scalar Philox, bit for bit, on every instruction set:
// lengths around the 64-element steps and the threads' chunks, infinities and NaN (x * 0), a call
// whose counters cross 2^32 inside one step of 16; and nn::Dropout's backward drawing its forward's
// pattern again (f32, bf16, f64).
#include <Random123/philox.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/dtype.h"
#include "nn/elementwise.h"
#include "nn/ew_test_util.h"
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;

// The scale of element e of the call: keep_scale when word e % 4 of Philox4x32-10(seed, (e / 4,
// its high word, call low, call high)) >= threshold, else 0.
float scale_of(const ew::DropoutDraw& d, uint64_t e) {
  r123::Philox4x32 gen;
  const uint64_t c = e / 4;
  const r123::Philox4x32::ctr_type ctr = {{static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32),
                                           static_cast<uint32_t>(d.call),
                                           static_cast<uint32_t>(d.call >> 32)}};
  const r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(d.seed), static_cast<uint32_t>(d.seed >> 32)}};
  return gen(ctr, key).v[e % 4] >= d.threshold ? d.keep_scale : 0.0f;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

std::vector<float> inputs(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  if (n > 5) {
    x[1] = std::numeric_limits<float>::infinity();
    x[2] = -std::numeric_limits<float>::infinity();
    x[3] = std::numeric_limits<float>::quiet_NaN();
    x[4] = -0.0f;
  }
  return x;
}

constexpr ew::DropoutDraw kDraw{0x1234'5678'9abc'def0ull, 0x0000'0003'0000'0007ull, 1288490188u,
                                1.0f / 0.7f};  // p = 0.3

TEST(DropoutKernel, F32AndBf16AreThePatternOnEveryIsa) {
  testing::for_each_ew_isa([&](cpu::Isa) {
    for (const int64_t n : {1, 3, 63, 64, 65, 130, 1000, 2 * 16384 + 77}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const std::vector<float> x = inputs(n);
      std::vector<float> y(x.size());
      ew::dropout_f32(kDraw, x.data(), y.data(), n);
      std::vector<uint16_t> x16(x.size()), y16(x.size());
      for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
      ew::dropout_bf16(kDraw, x16.data(), y16.data(), n);
      int64_t dropped = 0;
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(i);
        const float s = scale_of(kDraw, static_cast<uint64_t>(i));
        ASSERT_EQ(bits(y[k]), bits(x[k] * s)) << "f32 element " << i;
        ASSERT_EQ(y16[k], f32_to_bf16(bf16_to_f32(x16[k]) * s)) << "bf16 element " << i;
        dropped += s == 0.0f;
      }
      if (n >= 64) {
        EXPECT_GT(dropped, n / 10);
      }
    }
  });
}

// Elements from 4 (2^32 - 8) on: counters 2^32 - 8 .. 2^32 + 7 in one step of 16, whose high word
// changes halfway (the AVX2 and AVX-512 steps hand them to the scalar draws).
TEST(DropoutKernel, CountersCrossingTwoToThe32) {
  const int64_t e0 = ((int64_t{1} << 32) - 8) * 4, n = 64;
  const std::vector<float> x = inputs(n);
  std::vector<const ew::Kernels*> tables = {&ew::portable::kernels};
  if (cpu::isa_available(cpu::Isa::avx2)) tables.push_back(&ew::avx2::kernels);
  if (cpu::isa_available(cpu::Isa::avx512)) tables.push_back(&ew::avx512::kernels);
  for (const ew::Kernels* k : tables) {
    std::vector<float> y(x.size());
    k->dropout_f32(kDraw, x.data(), y.data(), e0, n);
    for (int64_t i = 0; i < n; ++i) {
      const size_t j = static_cast<size_t>(i);
      ASSERT_EQ(bits(y[j]), bits(x[j] * scale_of(kDraw, static_cast<uint64_t>(e0 + i))))
          << "element " << i;
    }
  }
}

// y = forward(1) is the pattern (0 or 1 / (1 - p)); backward(dy) must be dy * y in every dtype.
TEST(DropoutKernel, ModuleBackwardDrawsItsForwardsPatternAgain) {
  for (const DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    Dropout drop(0.25);
    drop.manual_seed(5);
    const Tensor ones = Tensor::full({7, 301}, 1.0, dt);
    const std::vector<double> y = drop.forward(ones).to_vector();
    // a second call draws another pattern; backward follows this last one
    const std::vector<double> y2 = drop.forward(ones).to_vector();
    EXPECT_NE(y, y2);
    const Tensor dy = random_tensor({7, 301}, 9, dt);
    const Tensor dx = drop.backward(dy);
    EXPECT_EQ(dx.dtype(), dt);
    const std::vector<double> g = dy.to_vector(), d = dx.to_vector();
    for (size_t i = 0; i < g.size(); ++i) {
      const bool kept = y2[i] != 0.0;  // (bf16: y2 is the scale rounded; the product is not)
      const double keep64 = 1.0 / 0.75;
      const float s = kept ? static_cast<float>(keep64) : 0.0f, gf = static_cast<float>(g[i]);
      const double want = dt == DType::f64   ? g[i] * (kept ? keep64 : 0.0)
                          : dt == DType::f32 ? gf * s
                                             : bf16_to_f32(f32_to_bf16(gf * s));
      ASSERT_EQ(d[i], want) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace attn::nn
