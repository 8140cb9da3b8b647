// bf16 modules (inference; the conversions are tested in elementwise_test.cc): the bf16 product against
// double on bf16 inputs (f32 accumulation + one rounding), Linear / LayerNorm / FeedForward /
// encoder layer against their f32 selves on the same bf16-rounded weights, and the backward refused.
#include "nn/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attn/nn.h"
#include "backends/cpu/tile_linear.h"
#include "nn/ops.h"
#include "nn_test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;
using testing::rel_error;

// bf16's unit roundoff: 2^-8.
constexpr double kBf16Eps = 1.0 / 256;

// y = x w^T + b on bf16 values: within f32 accumulation (K * 2^-24 * sum |x w|) plus one bf16
// rounding of |y| of the double product of the same bf16 values. Odd sizes; f32 and bf16 outputs.
TEST(Bf16, ProductIsTheDoubleProductRoundedOnce) {
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 29, 67},
                         {130, 200, 300},
                         {1, 5, 1},
                         {64, 64, 0}}) {
    const Tensor x = random_tensor({M, K}, 1, DType::bf16),
                 w = random_tensor({N, K}, 2, DType::bf16), b = random_tensor({N}, 3, DType::bf16);
    const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
    const Tensor x32 = x.to(DType::f32);  // the same values as f32 rows (Bf16Gemm::x32)
    for (bool f32_out : {false, true}) {
      Tensor y = Tensor::empty({M, N}, f32_out ? DType::f32 : DType::bf16);
      detail::Bf16Gemm g{.M = M,
                         .N = N,
                         .K = K,
                         .x = x.data_as<uint16_t>(),
                         .w = w.data_as<uint16_t>(),
                         .bias = b.data_as<uint16_t>(),
                         .y16 = f32_out ? nullptr : y.data_as<uint16_t>(),
                         .y32 = f32_out ? y.data_as<float>() : nullptr};
      detail::gemm_bf16(g);
      Tensor y_of_f32 = Tensor::empty({M, N}, y.dtype());
      g.x = nullptr;
      g.x32 = x32.data_as<float>();
      if (f32_out) {
        g.y32 = y_of_f32.data_as<float>();
      } else {
        g.y16 = y_of_f32.data_as<uint16_t>();
      }
      detail::gemm_bf16(g);
      EXPECT_TRUE(test::bitwise_equal(y_of_f32, y))
          << M << "x" << N << "x" << K << " from f32 rows";
      const std::vector<double> yv = y.to_vector();
      double worst = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double ref = bv[j], mag = std::abs(bv[j]);
          for (int64_t k = 0; k < K; ++k) {
            ref += xv[i * K + k] * wv[j * K + k];
            mag += std::abs(xv[i * K + k] * wv[j * K + k]);
          }
          const double bound = (f32_out ? 0.0 : kBf16Eps * std::abs(ref)) +
                               static_cast<double>(K + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
          worst = std::max(worst, std::abs(yv[i * N + j] - ref) / bound);
        }
      EXPECT_LE(worst, 1.0) << M << "x" << N << "x" << K << (f32_out ? " f32 out" : " bf16 out");
    }
  }
}

// A bf16 module and an f32 one holding the same (bf16-rounded) parameters.
template <class M>
void copy_rounded(const M& from_bf16, M& to_f32) {
  to_f32.load_state_dict(from_bf16.state_dict());
}

TEST(Bf16, LinearIsTheF32LinearRoundedOnce) {
  manual_seed(5);
  Linear l16(67, 45, true, DType::bf16), l32(67, 45, true, DType::f32);
  copy_rounded(l16, l32);
  EXPECT_EQ(l16.weight().value.dtype(), DType::bf16);
  const Tensor x = random_tensor({3, 11, 67}, 6, DType::bf16);
  const Tensor y16 = l16.forward(x), y32 = l32.forward(x);
  EXPECT_EQ(y16.dtype(), DType::bf16);
  EXPECT_EQ(y16.shape(), (Shape{3, 11, 45}));
  const std::vector<double> a = y16.to_vector(), b = y32.to_vector();
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::abs(a[i] - b[i]), kBf16Eps * std::abs(b[i]) + 1e-6) << i;
  // An f32 input is rounded to bf16 on entry: the same output as its rounded copy.
  EXPECT_TRUE(test::bitwise_equal(l16.forward(x.to(DType::f32)), y16));
  try {
    l16.backward(y16);
    FAIL() << "the backward of a bf16 Linear must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inference only"), std::string::npos) << e.what();
  }
}

TEST(Bf16, LayerNormComputesInF32AndRoundsItsOutput) {
  manual_seed(7);
  LayerNorm n16(83, 1e-5, true, true, DType::bf16), n32(83, 1e-5, true, true, DType::f32);
  Tensor w = random_tensor({83}, 8, DType::f32), b = random_tensor({83}, 9, DType::f32);
  n16.load_state_dict({{"weight", w}, {"bias", b}});
  copy_rounded(n16, n32);
  const Tensor x = random_tensor({5, 83}, 10, DType::bf16, -3, 5),
               r = random_tensor({5, 83}, 11, DType::bf16);
  const Tensor y16 = n16.forward_residual(x, r);
  // The f32 module on the f32 sum of the same bf16 values, rounded once.
  const Tensor y32 = n32.forward(detail::add(x.to(DType::f32), r.to(DType::f32)));
  EXPECT_EQ(y16.dtype(), DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(y16, y32.to(DType::bf16)));
  EXPECT_THROW(n16.backward(y16), Error);
}

// The encoder layer and FeedForward in bf16 against their f32 selves with the same weights: within
// bf16's error (a few roundings per sublayer), and not bitwise the f32 result (the rounding
// happens).
TEST(Bf16, EncoderLayerIsWithinBf16OfF32) {
  manual_seed(11);
  TransformerLayerOptions o;
  o.d_model = 48;
  o.nhead = 4;
  o.dim_feedforward = 96;
  o.dropout = 0.0;
  o.activation = Activation::gelu;
  o.batch_first = true;
  for (bool norm_first : {false, true}) {
    o.norm_first = norm_first;
    o.dtype = DType::bf16;
    TransformerEncoderLayer e16(o);
    o.dtype = DType::f32;
    TransformerEncoderLayer e32(o);
    copy_rounded(e16, e32);
    e16.eval();
    e32.eval();
    const Tensor x = random_tensor({3, 13, 48}, 12, DType::bf16);
    EncoderMasks m;
    m.src_key_padding_mask = Tensor::zeros({3, 13}, DType::boolean);
    for (int j = 9; j < 13; ++j) m.src_key_padding_mask.data_as<bool>()[2 * 13 + j] = true;
    const Tensor y16 = e16.forward(x, m), y32 = e32.forward(x, m);
    EXPECT_EQ(y16.dtype(), DType::bf16);
    const double err = rel_error(y16, y32);
    EXPECT_LE(err, 8 * kBf16Eps) << "norm_first " << norm_first;
    EXPECT_GT(err, 1e-4) << "norm_first " << norm_first;
    EXPECT_THROW(e16.backward(y16), Error);
  }
}

// FeedForward in bf16 for each activation against the f32 module on the same rounded weights (on
// the onednn path the activation runs as the first product's post-op): within a few bf16 roundings,
// and farther from the f32 module of every other activation (a wrong post-op would be caught; GELU's
// tanh form is the exception, within bf16 of the exact one, and not checked against it).
TEST(Bf16, FeedForwardAppliesItsActivation) {
  std::printf("[ BF16     ] FeedForward's activation: %s\n",
              detail::bf16_gemm_native() ? "oneDNN post-op (fused)" : "f32 pass after the product");
  const Activation acts[] = {Activation::relu, Activation::gelu, Activation::silu};
  const Tensor x = random_tensor({4, 9, 40}, 21, DType::bf16, -2, 2);
  std::vector<Tensor> y32(3);
  std::vector<Tensor> y16(3);
  for (int a = 0; a < 3; ++a) {
    manual_seed(13);
    FeedForward f16(40, 72, acts[a], 0.0, DType::bf16), f32(40, 72, acts[a], 0.0, DType::f32);
    copy_rounded(f16, f32);
    y16[a] = f16.forward(x);
    y32[a] = f32.forward(x);
    EXPECT_EQ(y16[a].dtype(), DType::bf16);
  }
  for (int a = 0; a < 3; ++a) {
    EXPECT_LE(rel_error(y16[a], y32[a]), 4 * kBf16Eps) << static_cast<int>(acts[a]);
    for (int b = 0; b < 3; ++b) {
      if (b != a) {
        EXPECT_GT(rel_error(y16[a], y32[b]), 8 * kBf16Eps) << a << " vs " << b;
      }
    }
  }
}

TEST(Bf16, ModulesRefuseOtherHalfTypesAndBf16PositionSchemes) {
  EXPECT_THROW(Linear(4, 4, true, DType::f16), Error);
  MultiHeadAttentionOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  o.dtype = DType::bf16;
  o.position = PositionScheme::rope;
  EXPECT_THROW(MultiHeadAttention{o}, Error);
  o.position = PositionScheme::none;
  EXPECT_NO_THROW(MultiHeadAttention{o});
}

TEST(Bf16, GemmKernelsNameTheBf16Path) {
  const std::string s = gemm_kernels();
  EXPECT_NE(s.find("; bf16: "), std::string::npos) << s;
  EXPECT_EQ(s.find("bf16: ") + 6, s.find(detail::bf16_gemm_path())) << s;
  // The path agrees with what the CPU has: oneDNN's bf16 matmul only with a bf16 dot instruction.
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bf16")) {
    EXPECT_FALSE(detail::bf16_gemm_native()) << s;
  }
#endif
  // Where the tiles run (AMX, or the emulation forced) and no other path is asked for, the path
  // names attn's tile product and its target.
  const char* env = std::getenv("ATTN_BF16_GEMM");
  const std::optional<cpu::Isa> tiles = cpu::tile_linear_isa();
  if (tiles && (env == nullptr || std::string(env) == "tiles")) {
    EXPECT_NE(s.find(fmt::format("attn's AMX tile product ({} target)", cpu::isa_name(*tiles))),
              std::string::npos)
        << s;
  } else {
    EXPECT_EQ(s.find("tile product"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace attn::nn
