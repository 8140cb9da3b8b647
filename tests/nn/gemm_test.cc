// The nn products (detail::gemm, detail::linear_forward): the f32 library runs vector kernels on a
// CPU that has them, and both overloads match a naive double loop on awkward shapes, every
// transpose, padded leading dims, alpha and beta, the threaded path included; the f32 Linear
// product's two routes (oneDNN's matmul, sgemm) each match it and are chosen by shape.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attn/nn/layers.h"
#include "attn/threads.h"
#include "nn/bf16.h"
#include "nn/elementwise.h"
#include "nn/matmul.h"
#include "nn/ops.h"
#include "test_util.h"

namespace attn::nn {
namespace {

TEST(GemmKernels, NotGenericOnAVectorCpu) {
  const std::string k = gemm_kernels();
  EXPECT_NE(k.find("f32: oneDNN"), std::string::npos) << k;
  EXPECT_EQ(k.find("GENERIC"), std::string::npos) << k;
  // A library that falls back to SSE kernels for a CPU it does not know (OpenBLAS 0.3.21 on Emerald
  // Rapids) must not be what runs the f32 products: oneDNN runs the active target's vectors
  // (core/isa.h: the best this CPU has, or ATTN_CPU_ISA's).
  const cpu::Isa target = cpu::vector_isa(cpu::active_isa());
  if (target != cpu::Isa::portable) {
    EXPECT_FALSE(gemm_kernels_generic()) << k;
    EXPECT_TRUE(k.find("ISA avx2") != std::string::npos ||
                k.find("ISA avx512") != std::string::npos)
        << k;
  }
  if (target == cpu::Isa::avx512) {
    EXPECT_NE(k.find("ISA avx512_core"), std::string::npos) << k;
  }
}

struct GemmCase {
  bool ta, tb;
  int64_t M, N, K;
  int64_t pad;  // added to each leading dim
  double alpha, beta;
};

// C = alpha op(A) op(B) + beta C against a double loop; error bound (K + 2) u (sum |a b| + |beta c|)
// per element, u the unit round-off of T. With beta == 0, C starts as NaN: it must not be read.
template <class T>
void check_gemm(const GemmCase& c, uint64_t seed) {
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  test::Rng rng(seed);
  std::vector<T> A(static_cast<size_t>(std::max<int64_t>(a_rows * lda, 1)));
  std::vector<T> B(static_cast<size_t>(std::max<int64_t>(b_rows * ldb, 1)));
  std::vector<T> C(static_cast<size_t>(c.M * ldc));
  for (T& x : A) x = static_cast<T>(rng.uniform(-1, 1));
  for (T& x : B) x = static_cast<T>(rng.uniform(-1, 1));
  for (T& x : C) {
    x = c.beta == 0 ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(rng.uniform(-1, 1));
  }
  const std::vector<T> C0 = C;
  detail::gemm(c.ta, c.tb, c.M, c.N, c.K, static_cast<T>(c.alpha), A.data(), lda, B.data(), ldb,
               static_cast<T>(c.beta), C.data(), ldc);
  const double u = std::numeric_limits<T>::epsilon() / 2;
  int bad = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.ta ? A[k * lda + i] : A[i * lda + k];
        const double b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b, mag += std::abs(a * b);
      }
      double want = c.alpha * s, bound = std::abs(c.alpha) * mag;
      if (c.beta != 0) {
        want += c.beta * C0[i * ldc + j];
        bound += std::abs(c.beta * C0[i * ldc + j]);
      }
      const double got = C[i * ldc + j];
      const double tol = (c.K + 2) * u * bound + std::numeric_limits<T>::min();
      if (!(std::abs(got - want) <= tol) && bad++ < 3) {
        ADD_FAILURE() << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K "
                      << c.K << " pad " << c.pad << " alpha " << c.alpha << " beta " << c.beta
                      << ": C[" << i << ", " << j << "] = " << got << ", want " << want << " (tol "
                      << tol << ")";
      }
    }
  }
  // The padding between rows of C is not written.
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = c.N; j < ldc; ++j) {
      const T was = C0[i * ldc + j], now = C[i * ldc + j];
      if (!(now == was || (std::isnan(now) && std::isnan(was)))) {
        ADD_FAILURE() << "padding of C written at [" << i << ", " << j << "]";
      }
    }
  }
}

template <class T>
void check_all_shapes() {
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t M : {1, 7, 33})
        for (int64_t N : {1, 7, 33})
          for (int64_t K : {1, 7, 33}) {
            check_gemm<T>({ta, tb, M, N, K, 0, 1.0, 0.0}, seed++);
            check_gemm<T>({ta, tb, M, N, K, 3, 1.0, 1.0}, seed++);
          }
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm<T>({ta, tb, 5, 6, 0, 2, 1.0, 0.5}, seed++);  // K = 0: C = beta C
      check_gemm<T>({ta, tb, 5, 6, 0, 0, 1.0, 0.0}, seed++);  // K = 0, beta = 0: C = 0
      check_gemm<T>({ta, tb, 19, 45, 70, 5, 0.5, -0.75}, seed++);
      // Over the one-thread threshold (4M multiply-adds): the threaded path, odd sizes throughout.
      check_gemm<T>({ta, tb, 201, 157, 131, 1, 1.0, 1.0}, seed++);
    }
}

TEST(Gemm, F32MatchesNaiveLoop) {
  set_num_threads(2);
  check_all_shapes<float>();
  set_num_threads(0);
}

TEST(Gemm, F64MatchesNaiveLoop) {
  set_num_threads(2);
  check_all_shapes<double>();
  set_num_threads(0);
}

// y = x w^T (+ b) of detail::linear_forward<float> against a double loop, on every f32 route: at most
// 64 rows (attn's dot-product kernel on an AVX2 / AVX-512 CPU), in >= out (oneDNN's matmul where
// f32_matmul_impl() names one) and in < out (sgemm), with and without a bias, odd sizes, one thread
// and the threaded paths.
void check_linear_f32(int64_t M, int64_t in, int64_t out, bool bias, uint64_t seed) {
  test::Rng rng(seed);
  std::vector<float> x(M * in), w(out * in), b(out), y(M * out, std::nanf(""));
  for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : w) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : b) v = static_cast<float>(rng.uniform(-1, 1));
  detail::linear_forward(x.data(), M, in, w.data(), bias ? b.data() : nullptr, out, y.data());
  const double u = std::numeric_limits<float>::epsilon() / 2;
  int bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double want = bias ? b[j] : 0.0, mag = std::abs(want);
      for (int64_t k = 0; k < in; ++k) {
        want += static_cast<double>(x[i * in + k]) * w[j * in + k];
        mag += std::abs(static_cast<double>(x[i * in + k]) * w[j * in + k]);
      }
      const double got = y[i * out + j], tol = (in + 2) * u * mag;
      if (!(std::abs(got - want) <= tol) && bad++ < 3) {
        ADD_FAILURE() << "M " << M << " in " << in << " out " << out << " bias " << bias
                      << " route " << detail::route_name(detail::f32_linear_route(M, in, out))
                      << ": y[" << i << ", " << j << "] = " << got << ", want " << want << " (tol "
                      << tol << ")";
      }
    }
  }
}

TEST(LinearForward, F32MatchesNaiveLoopOnEveryRoute) {
  std::printf("[ f32 route ] in >= out: %s\n", detail::f32_matmul_impl().empty()
                                                   ? "sgemm (no f32 matmul here)"
                                                   : detail::f32_matmul_impl().c_str());
  set_num_threads(2);
  uint64_t seed = 7;
  for (bool bias : {false, true}) {
    check_linear_f32(37, 301, 29, bias, seed++);    // dot (few rows), K % 16 != 0
    check_linear_f32(37, 29, 301, bias, seed++);    // dot
    check_linear_f32(1, 64, 64, bias, seed++);      // dot, one row
    check_linear_f32(64, 777, 1031, bias, seed++);  // dot, threaded (over 1M multiply-adds)
    check_linear_f32(45, 301, 29, bias, seed++);    // in >= out past 32 rows: matmul
    check_linear_f32(65, 301, 29, bias, seed++);    // in >= out: matmul
    check_linear_f32(65, 29, 301, bias, seed++);    // in < out: sgemm
    check_linear_f32(257, 300, 131, bias, seed++);  // threaded, in >= out
    check_linear_f32(201, 131, 157, bias, seed++);  // threaded, in < out
  }
  set_num_threads(0);
}

// The route is the shape's (and the CPU's vector target's) alone, and each route gives its own
// kernel's bits: at most 64 rows (32 when in >= out) exactly ew::linear_dot's on an AVX2 / AVX-512
// CPU, else in >= out
// exactly oneDNN's matmul (bias in its epilogue) where it is available, in < out exactly the bias
// rows plus sgemm (at 65 x 1000 x 200 the two library routes differ in most bits on a Zen 4). On an
// AVX-512 CPU oneDNN has a brgemm f32 matmul, so that route must be live.
TEST(LinearForward, F32RouteByShape) {
  const bool vectors = ew::active_isa() != cpu::Isa::portable;
  if (ew::active_isa() == cpu::Isa::avx512) {
    EXPECT_EQ(detail::f32_matmul_impl().rfind("brg", 0), 0u) << detail::f32_matmul_impl();
  }
  EXPECT_EQ(vectors, cpu::vector_isa(cpu::active_isa()) != cpu::Isa::portable);
  using detail::F32Route;
  const F32Route library = detail::f32_matmul_impl().empty() ? F32Route::sgemm : F32Route::matmul;
  EXPECT_EQ(detail::f32_linear_route(65, 300, 131), library);
  EXPECT_EQ(detail::f32_linear_route(65, 131, 131), library);
  EXPECT_EQ(detail::f32_linear_route(65, 131, 300), F32Route::sgemm);
  for (int64_t M : {1, 16, 64})
    EXPECT_EQ(detail::f32_linear_route(M, 131, 300), vectors ? F32Route::dot : F32Route::sgemm);
  for (int64_t M : {1, 32}) {
    EXPECT_EQ(detail::f32_linear_route(M, 300, 131), vectors ? F32Route::dot : library);
    EXPECT_EQ(detail::f32_linear_route(M, 131, 131), vectors ? F32Route::dot : library);
  }
  EXPECT_EQ(detail::f32_linear_route(33, 300, 131), library);
  test::Rng rng(3);
  for (const auto& [M, in, out] : {std::tuple<int64_t, int64_t, int64_t>{65, 1000, 200},
                                   {65, 131, 300},
                                   {45, 1000, 200},
                                   {45, 131, 300}}) {
    std::vector<float> x(M * in), w(out * in), b(out), y(M * out), want(M * out);
    for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
    for (float& v : w) v = static_cast<float>(rng.uniform(-1, 1));
    for (float& v : b) v = static_cast<float>(rng.uniform(-1, 1));
    detail::linear_forward(x.data(), M, in, w.data(), b.data(), out, y.data());
    const F32Route route = detail::f32_linear_route(M, in, out);
    if (route == F32Route::dot) {
      ew::linear_dot({.x = x.data(),
                      .w = w.data(),
                      .b = b.data(),
                      .y = want.data(),
                      .M = M,
                      .N = out,
                      .K = in});
    } else if (route == F32Route::matmul) {
      detail::run_matmul({.M = M,
                          .N = out,
                          .K = in,
                          .x = x.data(),
                          .w = w.data(),
                          .bias = b.data(),
                          .y = want.data()});
    } else {
      for (int64_t i = 0; i < M; ++i) std::copy(b.begin(), b.end(), want.begin() + i * out);
      detail::gemm(false, true, M, out, in, 1.0f, x.data(), in, w.data(), in, 1.0f, want.data(),
                   out);
    }
    EXPECT_EQ(y, want) << "M " << M << " in " << in << " out " << out << " route "
                       << detail::route_name(route);
  }
}

// The matmul primitives are made once and run from whichever thread calls: two threads running the
// same products at once get the serial result's bits (each call brings its own scratchpad; in
// oneDNN's default mode the scratchpad would be shared between them). Both routes and bf16.
TEST(LinearForward, ConcurrentCallersGetTheSerialBits) {
  const int64_t M = 96, in = 1000, out = 200;
  test::Rng rng(11);
  std::vector<float> x(M * in), w(out * in), b(out), want(M * out), want_t(M * in);
  for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : w) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : b) v = static_cast<float>(rng.uniform(-1, 1));
  std::vector<uint16_t> x16(M * in), w16(out * in), y16(M * out), want16(M * out);
  for (int64_t i = 0; i < M * in; ++i) x16[i] = f32_to_bf16(x[i]);
  for (int64_t i = 0; i < out * in; ++i) w16[i] = f32_to_bf16(w[i]);
  auto run_all = [&](float* y, float* yt, uint16_t* yb) {
    detail::linear_forward(x.data(), M, in, w.data(), b.data(), out, y);  // in >= out
    // in < out: w read as [in, out] rows of a Linear(out -> in)
    detail::linear_forward(x.data(), M / 5, out, w.data(), static_cast<const float*>(nullptr), in,
                           yt);
    detail::gemm_bf16({.M = M, .N = out, .K = in, .x = x16.data(), .w = w16.data(), .y16 = yb});
  };
  set_num_threads(1);
  run_all(want.data(), want_t.data(), want16.data());
  std::atomic<int> mismatches{0};
  auto worker = [&] {
    std::vector<float> y(M * out), yt(M * in);
    std::vector<uint16_t> yb(M * out);
    for (int rep = 0; rep < 40; ++rep) {
      run_all(y.data(), yt.data(), yb.data());
      if (y != want || !std::equal(yt.begin(), yt.begin() + (M / 5) * in, want_t.begin()) ||
          yb != want16) {
        ++mismatches;
      }
    }
  };
  std::thread a(worker), c(worker);
  a.join();
  c.join();
  set_num_threads(0);
  EXPECT_EQ(mismatches.load(), 0);
}

// The f32 library takes its team size from omp_get_max_threads(); a product must leave the caller's
// setting as it found it.
TEST(Gemm, LeavesTheCallersOpenMpSettingAlone) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  std::vector<float> A(300 * 300, 0.5f), B(300 * 300, 0.25f), C(300 * 300);
  detail::gemm(false, true, 300, 300, 300, 1.f, A.data(), 300, B.data(), 300, 0.f, C.data(), 300);
  EXPECT_EQ(omp_get_max_threads(), 3);
  EXPECT_FLOAT_EQ(C[0], 300 * 0.125f);
  omp_set_num_threads(before);
}

}  // namespace
}  // namespace attn::nn
