#include "nn/ops.h"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/nn/layers.h"
#include "core/isa.h"
#include "core/parallel.h"
#include "nn/bf16.h"
#include "nn/dnnl_isa.h"
#include "nn/elementwise.h"
#include "nn/matmul.h"

// f32 products run on oneDNN's sgemm (PyTorch's CPU library): it picks its kernels from the CPU's
// feature bits (AVX2, AVX-512, ...), never from a table of known models, so a CPU newer than the
// library still gets vector kernels. f64 products (gradient checks) stay on OpenBLAS through CBLAS:
// oneDNN has no dgemm. OpenBLAS's own functions are declared here in case cblas.h is another
// vendor's header; the build links OpenBLAS.
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_parallel(void);  // 0 sequential, 1 pthreads, 2 OpenMP
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace attn::nn {

namespace {

// Whether the f64 library (OpenBLAS) runs one of its pre-AVX2 x86-64 cores on a CPU with AVX2: what
// its DYNAMIC_ARCH build falls back to for a CPU it does not recognise (0.3.21 on Emerald Rapids:
// "Prescott").
bool openblas_generic() {
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

}  // namespace

std::string gemm_kernels() {
  detail::cap_onednn_isa();
  const dnnl_version_t* v = dnnl_version();
  std::string s = fmt::format("f32: oneDNN {}.{}.{} sgemm (ISA {})", v->major, v->minor, v->patch,
                              detail::dnnl_isa_name(dnnl_get_effective_cpu_isa()));
  if (!detail::f32_matmul_impl().empty())
    s += fmt::format(", Linear products with in >= out on its matmul ({})",
                     detail::f32_matmul_impl());
  if (!detail::onednn_isa_cap().empty())
    s += fmt::format(", capped to {} ({} {})", detail::onednn_isa_cap(), cpu::isa_source(),
                     cpu::isa_name(cpu::active_isa()));
  if (ew::linear_dot_route(1)) {
    s += fmt::format(
        ", Linear products of at most {} rows ({} when in >= out) on attn's dot-product kernel "
        "({})",
        ew::kDotLinearRows, ew::kDotLinearRows / 2, cpu::isa_name(ew::active_isa()));
  }
  if (gemm_kernels_generic()) s += ": GENERIC kernels, below this CPU's AVX2 / AVX-512 (slow)";
  s += fmt::format("; f64: {} (core {}{})", openblas_get_config(), openblas_get_corename(),
                   openblas_generic() ? ", generic" : "");
  s += "; bf16: " + detail::bf16_gemm_path();
  return s;
}

bool gemm_bf16_native() {
  return detail::bf16_gemm_native();
}

bool gemm_kernels_generic() {
  // oneDNN's effective ISA below what the active target allows: AVX2 + FMA, or AVX-512 F/BW/VL/DQ
  // (the set oneDNN calls avx512_core). Lower only when DNNL_MAX_CPU_ISA caps it below attn's
  // target or the OS hides the registers; a target the user chose (cap_onednn_isa) is no such case.
  static const bool generic = [] {
#if defined(__x86_64__)
    detail::cap_onednn_isa();
    const unsigned isa = dnnl_get_effective_cpu_isa();
    auto has = [isa](dnnl_cpu_isa_t want) { return (isa & want) == static_cast<unsigned>(want); };
    const cpu::Isa target = cpu::vector_isa(cpu::active_isa());
    return (target == cpu::Isa::avx2 && !has(dnnl_cpu_isa_avx2)) ||
           (target == cpu::Isa::avx512 && !has(dnnl_cpu_isa_avx512_core));
#else
    return false;
#endif
  }();
  return generic;
}

}  // namespace attn::nn

namespace attn::nn::detail {

namespace {

#if defined(__x86_64__)
// The oneDNN ISA of each target: the same instructions (amx-emulated is AVX2 code; portable has no
// oneDNN counterpart below SSE4.1, its baseline).
dnnl_cpu_isa_t onednn_isa_of(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::portable:
      return dnnl_cpu_isa_sse41;
    case cpu::Isa::avx2:
    case cpu::Isa::amx_emulated:
      return dnnl_cpu_isa_avx2;
    case cpu::Isa::avx512:
      return dnnl_cpu_isa_avx512_core;
    case cpu::Isa::avx512bf16:
      return dnnl_cpu_isa_avx512_core_bf16;
    case cpu::Isa::amx:
      return dnnl_cpu_isa_avx512_core_amx;
  }
  return dnnl_cpu_isa_all;
}
#endif

// The cap, set once before oneDNN's first use: its oneDNN name, or empty where the user chose no
// target (oneDNN then picks its best, or DNNL_MAX_CPU_ISA's).
const std::string& onednn_cap() {
  static const std::string cap = []() -> std::string {
#if defined(__x86_64__)
    if (!cpu::isa_chosen_by_user()) return "";
    const dnnl_cpu_isa_t isa = onednn_isa_of(cpu::active_isa());
    if (dnnl_set_max_cpu_isa(isa) != dnnl_success) {
      fail("attn::nn", fmt::format("oneDNN refused the instruction-set cap {} for target {} (was "
                                   "oneDNN used before attn's layers?)",
                                   dnnl_isa_name(isa), cpu::isa_name(cpu::active_isa())));
    }
    return dnnl_isa_name(isa);
#else
    return "";
#endif
  }();
  return cap;
}

}  // namespace

void cap_onednn_isa() {
  (void)onednn_cap();
}

std::string onednn_isa_cap() {
  return onednn_cap();
}

namespace {

// Says once, on the first f32 product, when the GEMM library runs generic kernels (see
// gemm_kernels).
void warn_if_generic() {
  static const bool warned = [] {
    cap_onednn_isa();
    if (gemm_kernels_generic()) {
      std::fprintf(stderr,
                   "attn: warning: the GEMM library runs generic kernels on this CPU: %s. Is "
                   "DNNL_MAX_CPU_ISA set?\n",
                   gemm_kernels().c_str());
    }
    return true;
  }();
  (void)warned;
}

// Threads cost more than they save on small products (and spin against OpenMP's workers on a busy
// machine): products under ~4M multiply-adds run on one thread, larger ones on attn's thread count
// (set_num_threads / ATTN_NUM_THREADS / all cores).
constexpr double kGemmThreadWork = 4e6;
double gemm_work(int64_t M, int64_t N, int64_t K) {
  return static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
}
int gemm_threads(int64_t M, int64_t N, int64_t K) {
  return gemm_work(M, N, K) < kGemmThreadWork ? 1 : resolve_threads(0);
}

// oneDNN's AVX2 sgemm (its kernels below avx512_core) gives other bits for other thread counts on
// some products (tests/nn/autocast_test.cc ThreadCountChangesNoBit under ATTN_CPU_ISA=avx2: 1
// against 3 threads differ, Zen 5; how it partitions the product was not looked into); its AVX-512
// sgemm gave the same bits on every shape tested. There, a product large enough to be threaded runs in fixed blocks of C, each
// one sgemm on one thread (gemm below): the same bits for any thread count.
constexpr int64_t kGemmBlock = 64;
bool sgemm_in_blocks(int64_t M, int64_t N, int64_t K) {
  static const bool below_avx512 = [] {
    cap_onednn_isa();
    const unsigned isa = dnnl_get_effective_cpu_isa();
    const auto want = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
    return (isa & want) != want;
  }();
  // gemm_threads' threshold: a rule of the shape, never of the thread count.
  return below_avx512 && gemm_work(M, N, K) >= kGemmThreadWork;
}

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t status =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // Only bad arguments fail (the callers pass checked shapes).
  if (status != dnnl_success) {
    fail("attn::nn::gemm", fmt::format("dnnl_sgemm failed (status {}) for M {} N {} K {}",
                                       static_cast<int>(status), M, N, K));
  }
}

// OpenBLAS's thread count is global to it, so it is changed only when it differs from the last one.
void set_openblas_threads(int want) {
  static std::atomic<int> current{-1};
  if (current.exchange(want) != want) openblas_set_num_threads(want);
}

// C [M, N] (row stride ldc) *= beta: the product when K == 0 (oneDNN refuses lda = 0).
template <class T>
void scale_rows(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
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
  int64_t rows = 1;  // the leading dims' product (not numel / d: d may be 0)
  for (int64_t i = 0; i + 1 < c.dim(); ++i) rows *= c.size(i);
  return c.view({rows, d});
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_rows(M, N, beta, C, ldc);
  warn_if_generic();
  const int threads = gemm_threads(M, N, K);
  if (!sgemm_in_blocks(M, N, K)) {
    const OmpThreadsFor omp_threads(threads);
    return sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  // Fixed blocks of kGemmBlock rows of C (or columns, when C is wider than tall), one sgemm on one
  // thread each: the partition depends on the shape alone.
  const bool rows = M >= N;
  const int64_t extent = rows ? M : N, blocks = (extent + kGemmBlock - 1) / kGemmBlock;
  parallel_for(blocks, threads, [&](int64_t b, int) {
    const OmpThreadsFor one(1);
    const int64_t i0 = b * kGemmBlock, n = std::min(kGemmBlock, extent - i0);
    if (rows) {
      sgemm(ta, tb, n, N, K, alpha, ta ? A + i0 : A + i0 * lda, lda, B, ldb, beta, C + i0 * ldc,
            ldc);
    } else {
      sgemm(ta, tb, M, n, K, alpha, A, lda, tb ? B + i0 * ldb : B + i0, ldb, beta, C + i0, ldc);
    }
  });
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_rows(M, N, beta, C, ldc);
  // OpenBLAS's OpenMP build takes omp_get_max_threads() per call (its openblas_set_num_threads
  // would change the caller's OpenMP default for good); the pthreads build keeps its own count.
  const int threads = gemm_threads(M, N, K);
  const bool openmp = openblas_get_parallel() == 2;
  const OmpThreadsFor omp_threads(openmp ? threads : omp_get_max_threads());
  if (!openmp) set_openblas_threads(threads);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

namespace {
// Rows or columns per task of the bias passes: about kBiasChunk elements each.
constexpr int64_t kBiasChunk = 16384;

int64_t per_task(int64_t length) {
  return std::max<int64_t>(1, kBiasChunk / std::max<int64_t>(length, 1));
}
}  // namespace

namespace {
// A 53 x 29 x 301 product on both f32 routes: the matmul is used only where it agrees with sgemm to
// f32 round-off (both accumulate in f32 over 301 terms of magnitude <= 1).
bool matmul_agrees_with_sgemm() {
  const int64_t M = 53, N = 29, K = 301;
  std::vector<float> x(M * K), w(N * K), b(N), y1(M * N), y2(M * N);
  for (int64_t i = 0; i < M * K; ++i) x[i] = static_cast<float>(std::sin(0.37 * i));
  for (int64_t i = 0; i < N * K; ++i) w[i] = static_cast<float>(std::cos(0.11 * i));
  for (int64_t i = 0; i < N; ++i) b[i] = 0.01f * static_cast<float>(i);
  run_matmul(
      {.M = M, .N = N, .K = K, .x = x.data(), .w = w.data(), .bias = b.data(), .y = y1.data()});
  for (int64_t i = 0; i < M; ++i) std::memcpy(&y2[i * N], b.data(), N * sizeof(float));
  gemm(false, true, M, N, K, 1.0f, x.data(), K, w.data(), K, 1.0f, y2.data(), N);
  for (int64_t i = 0; i < M * N; ++i)
    if (!(std::abs(y1[i] - y2[i]) <= 1e-4f)) return false;
  return true;
}
}  // namespace

const std::string& f32_matmul_impl() {
  static const std::string impl = [] {
    std::string name;
    try {
      name = matmul_impl(MatmulType::f32, MatmulType::f32, 1024, 384, 1536);
      if (name.rfind("brg", 0) != 0 || !matmul_agrees_with_sgemm()) name.clear();
    } catch (const dnnl::error&) {
      name.clear();
    }
    return name;
  }();
  return impl;
}

F32Route f32_linear_route(int64_t M, int64_t in, int64_t out) {
  // The library's matmul overtakes the dot kernel between 32 and 64 rows when in >= out (Zen 4,
  // 2 threads: 0.82-0.96x at 64 rows, 0.94-1.34x at 32); its sgemm (in < out) only past 64.
  if (ew::linear_dot_route(M) && (in < out || M <= ew::kDotLinearRows / 2)) return F32Route::dot;
  return in >= out && !f32_matmul_impl().empty() ? F32Route::matmul : F32Route::sgemm;
}

const char* route_name(F32Route route) {
  switch (route) {
    case F32Route::dot:
      return "dot";
    case F32Route::matmul:
      return "matmul";
    case F32Route::sgemm:
      return "sgemm";
  }
  return "?";
}

template <class T>
void linear_forward(const T* x, int64_t N, int64_t in, const T* w, const T* b, int64_t out, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    const F32Route route = f32_linear_route(N, in, out);
    if (N > 0 && out > 0 && in > 0 && route == F32Route::dot)
      return ew::linear_dot({.x = x, .w = w, .b = b, .y = y, .M = N, .N = out, .K = in});
    if (N > 0 && out > 0 && in > 0 && route == F32Route::matmul) {
      warn_if_generic();
      return run_matmul({.M = N, .N = out, .K = in, .x = x, .w = w, .bias = b, .y = y});
    }
  }
  if (b && out > 0) {
    const int64_t per = per_task(out);
    parallel_for((N + per - 1) / per, N * out < 2 * kBiasChunk ? 1 : 0, [&](int64_t t, int) {
      for (int64_t n = t * per; n < std::min(N, (t + 1) * per); ++n)
        std::memcpy(y + n * out, b, static_cast<size_t>(out) * sizeof(T));
    });
  }
  gemm(false, true, N, out, in, T(1), x, in, w, in, b ? T(1) : T(0), y, out);
}

template <class T>
void linear_backward(const T* dy, const T* x, int64_t N, int64_t in, int64_t out, const T* w, T* gw,
                     T* gb, T* dx) {
  gemm(false, false, N, in, out, T(1), dy, out, w, in, T(0), dx, in);
  gemm(true, false, out, in, N, T(1), dy, out, x, in, T(1), gw, in);
  if (gb) bias_grad(dy, N, out, gb);
}

template <class T>
void bias_grad(const T* dy, int64_t N, int64_t out, T* gb) {
  if (out == 0) return;
  // Blocks of 64 columns: each task reads its columns of every row (one cache line or four).
  constexpr int64_t kCols = 64;
  parallel_for((out + kCols - 1) / kCols, N * out < 2 * kBiasChunk ? 1 : 0, [&](int64_t t, int) {
    const int64_t o0 = t * kCols, o1 = std::min(out, o0 + kCols);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = o0; o < o1; ++o) gb[o] += dy[n * out + o];
  });
}

template void bias_grad(const float*, int64_t, int64_t, float*);
template void bias_grad(const double*, int64_t, int64_t, double*);

template void linear_forward(const float*, int64_t, int64_t, const float*, const float*, int64_t,
                             float*);
template void linear_forward(const double*, int64_t, int64_t, const double*, const double*, int64_t,
                             double*);
template void linear_backward(const float*, const float*, int64_t, int64_t, int64_t, const float*,
                              float*, float*, float*);
template void linear_backward(const double*, const double*, int64_t, int64_t, int64_t,
                              const double*, double*, double*, double*);

namespace {
// out[i] = a[i] + b[i] (out may be a), in chunks on attn's threads (fixed chunks: the same result for
// any thread count; the sum is element-wise anyway).
template <class T>
void add_arrays(const T* a, const T* b, T* out, int64_t n) {
  constexpr int64_t kChunk = 16384;
  parallel_for((n + kChunk - 1) / kChunk, n < 2 * kChunk ? 1 : 0, [&](int64_t t, int) {
    const int64_t end = std::min(n, (t + 1) * kChunk);
    for (int64_t i = t * kChunk; i < end; ++i) out[i] = a[i] + b[i];
  });
}
}  // namespace

void add_into(Tensor& dst, const Tensor& src_in) {
  if (dst.numel() != src_in.numel()) {
    fail("attn::nn::add_into",
         fmt::format("shapes {} and {} differ", dst.shape_str(), src_in.shape_str()));
  }
  const Tensor src = as_compute(src_in, dst.dtype());
  if (dst.dtype() == DType::bf16) {
    // bf16 modules: the sum in f32, rounded once (as torch's bf16 add).
    const uint16_t* b = src.data_as<uint16_t>();
    uint16_t* a = dst.data_as<uint16_t>();
    for (int64_t i = 0; i < dst.numel(); ++i)
      a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
    return;
  }
  dispatch(dst.dtype(), "attn::nn::add_into", [&](auto t) {
    using T = decltype(t);
    add_arrays(dst.data_as<T>(), src.data_as<T>(), dst.data_as<T>(), dst.numel());
  });
}

Tensor add(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) {
    fail("attn::nn::add", fmt::format("shapes {} and {} differ", a.shape_str(), b.shape_str()));
  }
  if (a.dtype() != DType::f32 && a.dtype() != DType::f64) {
    Tensor r = a.clone();
    add_into(r, b);
    return r;
  }
  const Tensor ac = a.contiguous();
  const Tensor bc = as_compute(b, a.dtype());
  Tensor r = Tensor::empty(a.shape(), a.dtype());
  dispatch(a.dtype(), "attn::nn::add", [&](auto t) {
    using T = decltype(t);
    add_arrays(ac.data_as<T>(), bc.data_as<T>(), r.data_as<T>(), a.numel());
  });
  return r;
}

}  // namespace attn::nn::detail
