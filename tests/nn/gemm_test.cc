// The nn products (detail::gemm): the f32 library runs vector kernels on a CPU that has them, and both
// overloads match a naive double loop on awkward shapes, every transpose, padded leading dims, alpha
// and beta, the threaded path included.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/nn/layers.h"
#include "attn/threads.h"
#include "nn/ops.h"
#include "test_util.h"

namespace attn::nn {
namespace {

TEST(GemmKernels, NotGenericOnAVectorCpu) {
  const std::string k = gemm_kernels();
  EXPECT_NE(k.find("f32: oneDNN"), std::string::npos) << k;
  EXPECT_EQ(k.find("GENERIC"), std::string::npos) << k;
#if defined(__x86_64__)
  // A library that falls back to SSE kernels for a CPU it does not know (OpenBLAS 0.3.21 on Emerald
  // Rapids) must not be what runs the f32 products.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_FALSE(gemm_kernels_generic()) << k;
    EXPECT_TRUE(k.find("ISA avx2") != std::string::npos ||
                k.find("ISA avx512") != std::string::npos)
        << k;
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    EXPECT_NE(k.find("ISA avx512_core"), std::string::npos) << k;
  }
#endif
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
