// Autocast (mixed-precision training, attn/nn/module.h): the backward's bf16 products against double
// on every stored layout; f32 modules under autocast against the bf16 modules (forward) and against
// double references of the same bf16 values (backward); gradients of whole layers against their f32
// selves; the mode's scope (per forward, kept by the backward, ignored by f64, position schemes in
// f32).
#include <gtest/gtest.h>

#include "attn/nn.h"
#include "nn/bf16.h"
#include "nn/nn_test_util.h"
#include "nn/ops.h"
#include "test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;
using testing::rel_error;

constexpr double kBf16Eps = 1.0 / 256;

const char* path() {
  return detail::bf16_gemm_native() ? "onednn" : "f32";
}

// x as double values of its bf16 rounding (what the bf16 products read).
std::vector<double> rounded(const Tensor& x) {
  return x.to(DType::bf16).to_vector();
}

// c = op(a) op(b) (+ c0) in double on the stored layouts of product_bf16.
std::vector<double> reference_product(const std::vector<double>& a, bool a_km,
                                      const std::vector<double>& b, bool b_nk, int64_t M, int64_t N,
                                      int64_t K, const std::vector<double>* c0) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = c0 ? (*c0)[m * N + n] : 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += a[a_km ? k * M + m : m * K + k] * b[b_nk ? n * K + k : k * N + n];
      c[m * N + n] = s;
    }
  }
  return c;
}

TEST(Autocast, ProductsOnEveryLayoutAgreeWithDouble) {
  const int64_t M = 37, N = 45, K = 131;
  for (bool a_km : {false, true}) {
    for (bool b_nk : {false, true}) {
      for (int out : {0, 1, 2}) {  // f32, bf16, f32 accumulated
        const Tensor a = random_tensor({M * K}, 1, DType::bf16),
                     b = random_tensor({K * N}, 2, DType::bf16),
                     c0 = random_tensor({M * N}, 3, DType::f32);
        Tensor c = out == 1 ? Tensor::empty({M * N}, DType::bf16) : c0.clone();
        detail::product_bf16({.M = M,
                              .N = N,
                              .K = K,
                              .a = a.data_as<uint16_t>(),
                              .a_km = a_km,
                              .b = b.data_as<uint16_t>(),
                              .b_nk = b_nk,
                              .c32 = out == 1 ? nullptr : c.data_as<float>(),
                              .c16 = out == 1 ? c.data_as<uint16_t>() : nullptr,
                              .accumulate = out == 2});
        const std::vector<double> c0v = c0.to_vector();
        const std::vector<double> want = reference_product(
            a.to_vector(), a_km, b.to_vector(), b_nk, M, N, K, out == 2 ? &c0v : nullptr);
        const std::vector<double> got = c.to_vector();
        for (size_t i = 0; i < got.size(); ++i) {
          // f32 accumulation over K terms of magnitude <= 1, plus one bf16 rounding for c16.
          const double tol = K * 1.2e-7 * 2 + (out == 1 ? kBf16Eps * std::abs(want[i]) : 0.0);
          ASSERT_NEAR(got[i], want[i], tol)
              << path() << " a_km " << a_km << " b_nk " << b_nk << " out " << out << " at " << i;
        }
      }
    }
  }
}

// Under autocast an f32 Linear computes what the bf16 Linear computes on its weights' bf16 copies,
// bit for bit; its backward gives dx = dy W, dW += dy^T x, db += sum dy on the bf16 values (f32
// accumulation), dx in the input's dtype; a second backward accumulates; the parameters stay f32.
TEST(Autocast, LinearForwardIsTheBf16LinearAndBackwardIsExactUpToF32Accumulation) {
  manual_seed(3);
  const int64_t in = 67, out = 45, rows = 33;
  Linear l32(in, out, true, DType::f32), l16(in, out, true, DType::bf16);
  l16.load_state_dict(l32.state_dict());
  for (DType xt : {DType::bf16, DType::f32}) {
    const Tensor x = random_tensor({3, 11, in}, 4, xt);
    Tensor y;
    {
      const Autocast on;
      y = l32.forward(x);
    }
    EXPECT_EQ(y.dtype(), DType::bf16);
    EXPECT_TRUE(test::bitwise_equal(y, l16.forward(x))) << path();
    EXPECT_EQ(l32.weight().value.dtype(), DType::f32);
    // The backward runs outside autocast, as torch's does: the forward's mode decides.
    const Tensor dy = random_tensor({3, 11, out}, 5, DType::f32);
    l32.zero_grad();
    const Tensor dx = l32.backward(dy);
    EXPECT_EQ(dx.dtype(), xt);
    EXPECT_EQ(dx.shape(), x.shape());
    const std::vector<double> xr = rounded(x), dyr = rounded(dy), w = rounded(l32.weight().value);
    const std::vector<double> dx_want = reference_product(dyr, false, w, false, rows, in, out, nullptr);
    const std::vector<double> dw_want = reference_product(dyr, true, xr, false, out, in, rows, nullptr);
    const std::vector<double> dx_got = dx.to_vector(), dw_got = l32.weight().grad.to_vector();
    for (size_t i = 0; i < dx_got.size(); ++i) {
      ASSERT_NEAR(dx_got[i], dx_want[i],
                  out * 3e-7 + (xt == DType::bf16 ? kBf16Eps * std::abs(dx_want[i]) : 0.0))
          << i;
    }
    for (size_t i = 0; i < dw_got.size(); ++i) ASSERT_NEAR(dw_got[i], dw_want[i], rows * 3e-7) << i;
    // db from dy before its rounding (f32 sums of the f32 gradient).
    const std::vector<double> dyv = dy.to_vector(), db = l32.bias()->grad.to_vector();
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t n = 0; n < rows; ++n) s += dyv[n * out + o];
      ASSERT_NEAR(db[o], s, rows * 1e-7) << o;
    }
    // Accumulates: a second forward + backward doubles the gradient.
    {
      const Autocast on;
      l32.forward(x);
    }
    l32.backward(dy);
    const std::vector<double> dw2 = l32.weight().grad.to_vector();
    for (size_t i = 0; i < dw2.size(); ++i)
      ASSERT_NEAR(dw2[i], 2 * dw_got[i], rows * 6e-7) << "dW accumulates, at " << i;
  }
}

}  // namespace
}  // namespace attn::nn
