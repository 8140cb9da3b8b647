#include "attn/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace attn {
namespace {

constexpr int64_t kBig = int64_t{1} << 40;

std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<double>(i);
  return v;
}

Tensor arange(const Shape& shape, DType dtype = DType::f64) {
  return Tensor::from_vector(shape, iota(checked_numel(shape, "test")), dtype);
}

TEST(Tensor, TransposeIsAViewAndContiguousCopies) {
  Tensor t = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5}, DType::f32);
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.data(), t.data());
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.at({2, 1}), 5.0);
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, OwningStorageIsAlignedAndContiguous) {
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::boolean, DType::i32,
                  DType::i64, DType::i8}) {
    const Tensor x = Tensor::zeros({3, 5, 7}, t);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data()) % 64, 0u);
    EXPECT_EQ(x.strides(), (Shape{35, 7, 1}));
    EXPECT_TRUE(x.is_contiguous());
    EXPECT_EQ(x.itemsize(), dtype_size(t));
  }
}

TEST(Tensor, SliceWithStepsIsAView) {
  const Tensor t = arange({4, 10});
  const Tensor s = t.slice(1, 1, 9, 3);  // columns 1, 4, 7
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_EQ(s.strides(), (Shape{10, 3}));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{1, 4, 7, 11, 14, 17, 21, 24, 27, 31, 34, 37}));
  EXPECT_EQ(t.slice(0, -2, 100).to_vector(), iota(20, 20));  // negative start, clamped stop
  EXPECT_EQ(t.slice(1, 5, 2).shape(), (Shape{4, 0}));        // empty
  EXPECT_EQ(t.slice(1, 0, 10, std::numeric_limits<int64_t>::max()).shape(), (Shape{4, 1}));
  EXPECT_THROW(t.slice(1, 0, 10, 0), Error);
  EXPECT_THROW(t.slice(2, 0, 1), Error);
  // Writing through the view writes the base.
  Tensor base = arange({4, 10});
  base.slice(1, 1, 9, 3).set({2, 1}, -1);
  EXPECT_EQ(base.at({2, 4}), -1);
}

TEST(Tensor, SelectSqueezeUnsqueeze) {
  const Tensor t = arange({2, 3, 4});
  EXPECT_EQ(t.select(1, -1).to_vector(), (std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(t.select(2, 0).shape(), (Shape{2, 3}));
  EXPECT_THROW(t.select(1, 3), Error);
  EXPECT_THROW(t.select(1, -4), Error);
  const Tensor u = t.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3, 4}));
  EXPECT_TRUE(u.is_contiguous());
  EXPECT_EQ(u.unsqueeze(-1).shape(), (Shape{2, 1, 3, 4, 1}));
  EXPECT_EQ(u.squeeze(1).to_vector(), t.to_vector());
  EXPECT_THROW(t.squeeze(0), Error);
  Tensor r8 = Tensor::zeros({1, 1, 1, 1, 1, 1, 1, 1}, DType::f32);
  EXPECT_THROW(r8.unsqueeze(0), Error);
}

TEST(Tensor, PermuteAndTranspose) {
  const Tensor t = arange({2, 3, 4});
  const Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(p.at({a, b, c}), t.at({b, c, a}));
  EXPECT_EQ(t.transpose(-1, 0).shape(), (Shape{4, 3, 2}));
  EXPECT_THROW(t.permute({0, 0, 1}), Error);
  EXPECT_THROW(t.permute({0, 1}), Error);
  EXPECT_THROW(t.transpose(0, 3), Error);
}

TEST(Tensor, ExpandBroadcastsWithStrideZero) {
  const Tensor row = arange({1, 3});
  const Tensor e = row.expand({2, 4, 3});
  EXPECT_EQ(e.strides(), (Shape{0, 0, 1}));
  EXPECT_EQ(e.data(), row.data());
  EXPECT_EQ(e.at({1, 3, 2}), 2);
  EXPECT_THROW(row.expand({2, 4}), Error);
  EXPECT_THROW(arange({3}).expand({1}), Error);
  EXPECT_THROW(row.expand({-1, 3}), Error);
  EXPECT_THROW(row.expand({kBig, kBig, 3}), Error);  // element count overflows
  // copy_from broadcasts the source.
  Tensor dst = Tensor::zeros({2, 3}, DType::f32);
  dst.copy_from(row);
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(broadcast_shapes({3, 1, 5}, {4, 1}, "t"), (Shape{3, 4, 5}));
  EXPECT_THROW(broadcast_shapes({3, 2}, {3}, "t"), Error);
}

TEST(Tensor, ViewAndReshape) {
  const Tensor t = arange({2, 3, 4});
  const Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.data(), t.data());
  EXPECT_THROW(t.view({5, -1}), Error);  // 24 is not a multiple of 5
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_THROW(t.view({25}), Error);
  EXPECT_THROW(t.view({-2, -12}), Error);         // negative dims other than -1
  EXPECT_THROW(t.view({kBig, kBig, -1}), Error);  // overflowing product of known dims
  const Tensor tt = t.transpose(0, 2);
  EXPECT_THROW(tt.view({24}), Error);   // not contiguous
  const Tensor r = tt.reshape({4, 6});  // copies
  EXPECT_NE(r.data(), t.data());
  EXPECT_EQ(r.to_vector(), tt.contiguous().to_vector());
  EXPECT_EQ(t.reshape({24}).data(), t.data());  // a view when possible
  EXPECT_EQ(Tensor::zeros({0, 3}, DType::f32).view({-1, 3}).shape(), (Shape{0, 3}));
}

TEST(Tensor, AsStridedMakesOverlappingWindows) {
  const Tensor t = arange({10});
  const Tensor w = t.as_strided({4, 3}, {2, 1}, 1);  // windows of 3 starting at 1, 3, 5, 7
  EXPECT_EQ(w.to_vector(), (std::vector<double>{1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8, 9}));
  EXPECT_THROW(t.as_strided({4}, {1, 1}), Error);
  EXPECT_THROW(t.as_strided({-4}, {1}), Error);
}

TEST(Tensor, OverflowingOrInvalidShapesAreRefused) {
  EXPECT_THROW(Tensor::empty({kBig, kBig}, DType::f32), Error);
  EXPECT_THROW(Tensor::empty({int64_t{1} << 61}, DType::f64), Error);  // byte count overflows
  EXPECT_THROW(Tensor::empty({0, kBig, kBig}, DType::f32),
               Error);  // strides overflow even with numel 0
  EXPECT_THROW(Tensor::empty({-1, 3}, DType::f32), Error);
  EXPECT_THROW(Tensor::empty({1, 1, 1, 1, 1, 1, 1, 1, 1}, DType::f32), Error);
  EXPECT_THROW(contiguous_strides({kBig, kBig}), Error);
  EXPECT_THROW(checked_numel({std::numeric_limits<int64_t>::max(), 2}, "t"), Error);
  EXPECT_THROW(Tensor::from_vector({2, 2}, {1, 2, 3}, DType::f32), Error);
  EXPECT_EQ(checked_numel({0, std::numeric_limits<int64_t>::max()}, "t"), 0);
  const Tensor empty = Tensor::zeros({3, 0, 2}, DType::f32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.to_vector().empty());
  EXPECT_EQ(empty.clone().shape(), (Shape{3, 0, 2}));
}

TEST(Tensor, CopiesAndConversionsBetweenDtypes) {
  const Tensor src = Tensor::from_vector({2, 2}, {1.5, -2.25, 3e9, 0.1}, DType::f64);
  EXPECT_EQ(src.to(DType::f32).to_vector(),
            (std::vector<double>{1.5, -2.25, 3e9, static_cast<float>(0.1)}));
  const Tensor c = src.clone();
  EXPECT_NE(c.data(), src.data());
  EXPECT_EQ(src.to(DType::f64).data() != src.data(), true);  // to() always copies
  EXPECT_EQ(src.to(DType::boolean).to_vector(), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(Tensor::from_vector({3}, {2.9, -2.9, 0}, DType::i32).to_vector(),
            (std::vector<double>{2, -2, 0}));
  // Out-of-range and NaN stores into integers saturate instead of being undefined behaviour.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(Tensor::from_vector({3}, {1e20, -1e20, nan}, DType::i32).to_vector(),
            (std::vector<double>{2147483647.0, -2147483648.0, 0}));
  EXPECT_EQ(Tensor::from_vector({5}, {300, -300, nan, 2.9, -2.9}, DType::i8).to_vector(),
            (std::vector<double>{127, -128, 0, 2, -2}));
  EXPECT_EQ(Tensor::from_vector({2}, {1e30, -1e30}, DType::i64).to_vector(),
            (std::vector<double>{9223372036854775807.0, -9223372036854775808.0}));
  // A transposed f32 source into a bf16 destination (the strided conversion path).
  const Tensor t32 = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6}, DType::f32).transpose(0, 1);
  EXPECT_EQ(t32.to(DType::bf16).to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(t32.to(DType::f16).to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

float bits_f32(uint32_t u) {
  return std::bit_cast<float>(u);
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808000)), 0x3f80);  // tie 1 + 2^-8: to even (down)
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f818000)), 0x3f82);  // tie 1 + 3 * 2^-8: to even (up)
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808001)), 0x3f81);  // just above the tie: up
  EXPECT_EQ(f32_to_bf16(bits_f32(0xbf808000)), 0xbf80);  // sign symmetric
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(f32_to_bf16(bits_f32(0x7f7f7fff)), 0x7f7f);               // the largest bf16 stays
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(bits_f32(0x00008000)), 0x0000);  // subnormal tie to even (0)
  EXPECT_EQ(f32_to_bf16(bits_f32(0x00018000)), 0x0002);  // subnormal tie to even (2)
  EXPECT_EQ(f32_to_bf16(bits_f32(0x80000000)), 0x8000);  // -0 stays -0
  const uint16_t nan =
      f32_to_bf16(bits_f32(0x7f800001));  // a NaN whose payload would truncate to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(0x3f81), 1.0078125f);
}

// An independent oracle: the nearest bf16 by comparing the two candidates as doubles, ties to even.
uint16_t bf16_oracle(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double x = f, a = bf16_to_f32(lo);
  // The next candidate away from zero; the one past the largest finite is inf (treated as 2^128).
  const double b =
      (hi & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0, 128), x) : bf16_to_f32(hi);
  const double da = std::fabs(x - a), db = std::fabs(b - x);
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Dtype, Bf16MatchesAnOracleOnRandomBitPatterns) {
  std::mt19937 rng(42);
  for (int n = 0; n < 200000; ++n) {
    uint32_t u = rng();
    if (n % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = bits_f32(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), bf16_oracle(f)) << std::hex << u;
  }
}

TEST(Dtype, F16RoundsToNearestEvenWithOverflowAndSubnormals) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);                          // the largest f16
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);                          // below the tie
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                          // the tie rounds to inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)),
            0x0400);                                         // rounds up into normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);      // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie to even (0)
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(
      std::isnan(f16_to_f32(f32_to_f16(bits_f32(0x7f800001)))));  // payload lost in the top bits
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(Dtype, F16RoundTripsEveryValueAndMatchesAnOracle) {
  // Every f16 converts to f32 and back unchanged (NaNs stay NaN).
  std::vector<float> finite;  // the non-negative finite f16 values in increasing order
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    if (h < 0x7c00) finite.push_back(f);
  }
  // Random f32 values against a nearest-value search over that table, ties to the even code.
  std::mt19937 rng(7);
  for (int n = 0; n < 200000; ++n) {
    uint32_t u = rng() & 0x7fffffffu;
    if (n % 2 == 0) u = 0x30000000u + (u % 0x18000000u);  // concentrate on the f16 range
    const float f = bits_f32(u);
    if (std::isnan(f)) continue;
    uint16_t want;
    if (f >= 65520.0f) {
      want = 0x7c00;
    } else {
      const auto it = std::lower_bound(finite.begin(), finite.end(), f);
      const size_t hi = static_cast<size_t>(it - finite.begin());
      if (hi < finite.size() && finite[hi] == f) {
        want = static_cast<uint16_t>(hi);
      } else {
        const size_t lo = hi - 1;
        const double dl = static_cast<double>(f) - finite[lo];
        const double dh = hi < finite.size() ? finite[hi] - static_cast<double>(f) : 1e300;
        want = static_cast<uint16_t>(dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi));
      }
    }
    ASSERT_EQ(f32_to_f16(f), want) << std::hex << u;
    ASSERT_EQ(f32_to_f16(-f), want | 0x8000) << std::hex << u;
  }
}

TEST(Dtype, ParseAndNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_STREQ(dtype_name(DType::boolean), "bool");
}

}  // namespace
}  // namespace attn
