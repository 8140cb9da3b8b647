#include "nn/ops.h"

#include <cblas.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "attn/nn/layers.h"
#include "core/parallel.h"

// OpenBLAS's thread control (declared here too in case cblas.h is another vendor's header; the
// build links OpenBLAS).
extern "C" {
void openblas_set_num_threads(int num_threads);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace attn::nn {

std::string gemm_kernels() {
  std::string s = fmt::format("{} (core {})", openblas_get_config(), openblas_get_corename());
  if (gemm_kernels_generic()) s += ": GENERIC kernels on a CPU with AVX2 or AVX-512 (slow)";
  return s;
}

bool gemm_kernels_generic() {
  // OpenBLAS's pre-AVX2 x86-64 cores: what its DYNAMIC_ARCH build falls back to for a CPU it does
  // not recognise.
  static const bool generic = [] {
    const std::string core = openblas_get_corename();
    const bool old = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                     core == "Nehalem" || core == "Dunnington" || core == "Atom" ||
                     core == "Barcelona" || core == "Opteron";
#if defined(__x86_64__)
    return old && __builtin_cpu_supports("avx2");
#else
    return false;
#endif
  }();
  return generic;
}

}  // namespace attn::nn

namespace attn::nn::detail {

namespace {

// Says once, on the first product, when the GEMM library runs generic kernels (see gemm_kernels).
void warn_if_generic() {
  static const bool warned = [] {
    if (gemm_kernels_generic()) {
      std::fprintf(stderr,
                   "attn: warning: the GEMM library runs generic kernels on this CPU: %s. Set "
                   "OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2) before starting the "
                   "process for its fast kernels.\n",
                   gemm_kernels().c_str());
    }
    return true;
  }();
  (void)warned;
}

// OpenBLAS threads cost more than they save on small products (and spin against OpenMP's workers on
// a busy machine): products under ~4M multiply-adds run on one thread, larger ones on attn's thread
// count (set_num_threads / ATTN_NUM_THREADS / all cores). The setting is global to OpenBLAS, so it
// is changed only when it differs from the last one.
void set_blas_threads(int64_t M, int64_t N, int64_t K) {
  warn_if_generic();
  static std::atomic<int> current{-1};
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const int want = work < 4e6 ? 1 : resolve_threads(0);
  if (current.exchange(want) != want) openblas_set_num_threads(want);
}

}  // namespace

Tensor rows_of(const Tensor& x, int64_t d, DType dtype, const char* fn, const char* name) {
  if (!x.defined()) fail(fn, fmt::format("{} is undefined", name));
  if (!is_floating(x.dtype())) {
    fail(fn, fmt::format("{} must be floating, got {} with shape {}", name, dtype_name(x.dtype()),
                         x.shape_str()));
  }
  if (x.dim() < 1 || x.size(-1) != d) {
    fail(fn, fmt::format("{} must have last dim {}, got shape {}", name, d, x.shape_str()));
  }
  Tensor c = as_compute(x, dtype);
  return c.view({c.numel() / std::max<int64_t>(d, 1), d});
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  set_blas_threads(M, N, K);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  set_blas_threads(M, N, K);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

void add_into(Tensor& dst, const Tensor& src_in) {
  if (dst.numel() != src_in.numel()) {
    fail("attn::nn::add_into",
         fmt::format("shapes {} and {} differ", dst.shape_str(), src_in.shape_str()));
  }
  const Tensor src = as_compute(src_in, dst.dtype());
  dispatch(dst.dtype(), "attn::nn::add_into", [&](auto t) {
    using T = decltype(t);
    T* d = dst.data_as<T>();
    const T* s = src.data_as<T>();
    const int64_t n = dst.numel();
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  });
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor r = a.clone();
  add_into(r, b);
  return r;
}

}  // namespace attn::nn::detail
