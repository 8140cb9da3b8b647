// Small internal helpers shared by the nn modules: dtype dispatch, gemm for float (oneDNN) and double
// (OpenBLAS), contiguous row views. Kernels are templates over the compute type T (float or double).
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "attn/error.h"
#include "attn/nn/module.h"
#include "attn/tensor.h"
#include "core/fail.h"

namespace attn::nn::detail {

using attn::detail::fail;

// A seed derived from (a, b) by SplitMix64's finaliser: the dropout seed of call b of a module seeded a.
inline uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Calls f(T{}) with T = float for f32 and double for f64; other dtypes are refused.
template <class F>
decltype(auto) dispatch(DType dtype, const char* fn, F&& f) {
  if (dtype == DType::f32) return f(float{});
  if (dtype == DType::f64) return f(double{});
  fail(fn, fmt::format("modules compute in f32 or f64, got {}", dtype_name(dtype)));
}

inline void check_compute_dtype(DType dtype, const char* fn) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    fail(fn, fmt::format("modules compute in f32 or f64, got {}", dtype_name(dtype)));
  }
}
// The modules that also run in bf16 (inference; see nn/bf16.h) check with this one.
inline void check_module_dtype(DType dtype, const char* fn) {
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16) {
    fail(fn,
         fmt::format("modules compute in f32, f64 or bf16 (inference), got {}", dtype_name(dtype)));
  }
}
// The backward of a bf16 module: refused, naming what to do instead.
inline void check_backward_dtype(DType dtype, const char* fn) {
  if (dtype == DType::bf16) {
    fail(fn,
         "bf16 modules run inference only; train f32 modules, in bf16 under autocast "
         "(attn::nn::Autocast, attn.nn.autocast(): bf16 products, f32 weights and gradients)");
  }
}

// x as a contiguous tensor of `dtype` (no copy when it already is one; f32 <-> bf16 vectorised).
Tensor convert(const Tensor& x, DType dtype);  // nn/bf16.cc
inline Tensor as_compute(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x.contiguous();
  return convert(x, dtype);
}

// x [..., d] (of any floating dtype) -> a contiguous [N, d] tensor of `dtype`; checks the last dim.
Tensor rows_of(const Tensor& x, int64_t d, DType dtype, const char* fn, const char* name);

// C = alpha * op(A) op(B) + beta * C, row-major; op = transpose when ta / tb.
// A is [M, K] (or [K, M] when ta), B is [K, N] (or [N, K] when tb), C is [M, N].
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// y [N, out] = x [N, in] W^T (+ b [out] when b), W [out, in] row-major (a Linear's weight or a
// row block of MultiHeadAttention's in_proj_weight). T = float or double. f32 products take one of
// three routes (f32_linear_route), chosen by the shape (and the CPU's vector target) alone, never by
// timings: the same product gives the same bits every run.
//   dot     N <= 64 (32 when in >= out) on an AVX2 / AVX-512 CPU: attn's dot-product kernel
//           (ew::linear_dot), W read in place: the library GEMMs pack all of W on every call,
//           which made them 1.3-3.6x slower at N 16 (Zen 4; docs/PERFORMANCE.md, "Linear routes");
//   matmul  in >= out: oneDNN's matmul primitive, bias added in its epilogue, where it has a brgemm
//           implementation that agrees with sgemm (f32_matmul_impl): its sgemm ran those long
//           reductions 13-26% slower on a Zen 4 (4096 x 384 x 1536: 177 against 218-224 GFLOP/s);
//   sgemm   otherwise: b copied into y's rows first, in row chunks on attn's threads, and oneDNN's
//           sgemm adds onto it.
template <class T>
void linear_forward(const T* x, int64_t N, int64_t in, const T* w, const T* b, int64_t out, T* y);
enum class F32Route { dot, matmul, sgemm };
F32Route f32_linear_route(int64_t N, int64_t in, int64_t out);
const char* route_name(F32Route route);
// The matmul's implementation name for f32 ("brg:avx512_core"), or "" where f32 products never take
// it (no brgemm for f32 on this CPU, or its check product disagreed with sgemm).
const std::string& f32_matmul_impl();
// Its backward: dx [N, in] = dy W, gw [out, in] += dy^T x, gb [out] += sum_n dy (when gb). The bias
// sum runs in column blocks on attn's threads, each column summed over n in order: the serial sum's
// bits for any thread count.
template <class T>
void linear_backward(const T* dy, const T* x, int64_t N, int64_t in, int64_t out, const T* w, T* gw,
                     T* gb, T* dx);

// gb [out] += the column sums of dy [N, out], each column summed over n in order on attn's threads
// (the serial sum's bits for any thread count). T = float or double (bf16 rows:
// ew::column_sums_bf16).
template <class T>
void bias_grad(const T* dy, int64_t N, int64_t out, T* gb);

// Whether a module of this dtype runs under autocast now (an f32 module while autocast is on).
inline bool autocasts(DType module_dtype) {
  return module_dtype == DType::f32 && autocast_enabled();
}
// A module's input in the dtype it computes in; under autocast (cast), f32 and bf16 inputs pass as
// they are (the products round them to bf16, the LayerNorms read either).
inline Tensor as_module_input(const Tensor& x, DType module_dtype, bool cast) {
  if (cast && (x.dtype() == DType::f32 || x.dtype() == DType::bf16)) return x;
  return as_compute(x, module_dtype);
}

// dst += src elementwise (same numel, contiguous, same dtype).
void add_into(Tensor& dst, const Tensor& src);
// a + b as a new tensor (same shape, contiguous inputs of one dtype).
Tensor add(const Tensor& a, const Tensor& b);

// oneDNN's instruction set follows core/isa.h's choice: where the user chose a target (ATTN_CPU_ISA,
// or cpu::force_isa before oneDNN's first use), oneDNN is capped to the same instructions
// (dnnl_set_max_cpu_isa; amx-emulated, AVX2 code, caps it to avx2); otherwise it picks its best (and
// honours DNNL_MAX_CPU_ISA). Once per process, before any oneDNN call: oneDNN latches its ISA at its
// first use. Every function here that calls oneDNN calls this first.
void cap_onednn_isa();
// The oneDNN ISA the active target allows ("" where nothing was capped), for gemm_kernels().
std::string onednn_isa_cap();

}  // namespace attn::nn::detail
