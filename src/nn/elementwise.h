// The element-wise f32 kernels of attn::nn: activations (exact GELU, tanh-GELU, SiLU, ReLU) forward
// and backward, the bias + activation pass after a GEMM, and LayerNorm (optionally of x + residual)
// forward and backward; and, on the same per-ISA machinery, the product of a Linear with few rows.
// Vectorised with GCC vector extensions, compiled once per instruction set (elementwise_<isa>.cc
// include elementwise-inl.h) for the plain-vector width of core/isa.h's one instruction-set choice
// (cpu::vector_isa(cpu::active_isa()): ATTN_CPU_ISA and cpu::force_isa apply), and threaded through
// parallel_for in fixed-size chunks (the result never depends on the thread count). f64 stays on
// the scalar reference code in layers.cc.
//
// Accuracy (tests/nn/elementwise_test.cc measures it against double on every ISA): the activations
// and erf evaluate in double lanes and round once, within 0.51 ulp over the whole f32 range (GELU,
// with cheaper fits of its own: 0.65), tails included (GELU's negative tail through erfc = exp(-x^2
// / 2) erfcx, not 1 + erf); ±inf give the limits
// (f(+inf) = +inf, f(-inf) = -0, f'(+inf) = 1, f'(-inf) = 0), NaN propagates. Forwards whose results
// are rounded to bf16 (the bf16 modules, autocast, the fused product epilogues) take float lanes with
// fits sized for bf16: within 0.53 bf16 ulp of the exact value. LayerNorm computes in f32 with mean
// and variance accumulated in double.
#pragma once
#include <cstdint>

#include "attn/nn/layers.h"
#include "core/isa.h"

namespace attn::nn::ew {

// The copy of the kernels that runs: portable, avx2 or avx512, the plain-vector width of the active
// target (cpu::vector_isa(cpu::active_isa())).
cpu::Isa active_isa();

// y = f(x) and dx = dy * f'(x) over n contiguous floats (y may alias x, dx may alias dy).
void act_forward(Activation a, const float* x, float* y, int64_t n);
void act_backward(Activation a, const float* x, const float* dy, float* dx, int64_t n);
// One pass after a GEMM without bias: h[r, c] += b[c] in place (h keeps the pre-activation for the
// backward) and y[r, c] = f(h[r, c]), for rows x cols (row-major, contiguous).
void bias_act_forward(Activation a, float* h, const float* b, float* y, int64_t rows, int64_t cols);
// h[r, c] = bf16(f(h[r, c] + b[c])) in place, kept as f32 (every value a bf16 one): the bf16 FFN's
// activations for a second product that takes f32 rows (no bf16 tensor, no widening pass).
void bias_act_round_bf16(Activation a, float* h, const float* b, int64_t rows, int64_t cols);
// Autocast's FFN: h[r, c] += b[c] in place (h keeps the pre-activation) and out[r, c] = bf16(f(h[r,
// c])), one pass; and its backward dx[r, c] = bf16(dy[r, c] f'(x[r, c])) from bf16 dy, with db[c] +=
// the column sums of the f32 products before rounding (when db; partial sums per fixed row chunk,
// added in chunk order: the same bits for any thread count).
void bias_act_forward_bf16(Activation a, float* h, const float* b, uint16_t* out, int64_t rows,
                           int64_t cols);
void act_backward_bf16(Activation a, const float* x, const uint16_t* dy, uint16_t* dx, float* db,
                       int64_t rows, int64_t cols);
// y = bf16(f(x)) over n contiguous bf16 elements (y may alias x), one pass: the bf16 activation
// modules. GELU, tanh-GELU and SiLU in float lanes with fits sized for bf16 (within 0.53 bf16 ulp of
// the exact value), ReLU the f32 kernel's result, bit for bit.
void act_forward_bf16(Activation a, const uint16_t* x, uint16_t* y, int64_t n);
// db [cols] += the column sums of bf16 y [rows, cols] in f32 (partial sums per fixed row chunk, added
// in chunk order: the same bits for any thread count): the bias gradients of autocast's products.
void column_sums_bf16(const uint16_t* y, int64_t rows, int64_t cols, float* db);
// y = erf(x) (the kernel GELU uses; for tests).
void erf(const float* x, float* y, int64_t n);

// bf16 bit patterns <-> f32 over n contiguous elements: widening is exact (a shift); rounding is to
// nearest even, a NaN stays a quiet NaN (attn::f32_to_bf16's bits). out [rows, cols] = bf16(y + b)
// rounds a GEMM's f32 rows with the bias b [cols] added in f32 first (b may be null).
void widen_bf16(const uint16_t* src, float* dst, int64_t n);
void round_bf16(const float* src, uint16_t* dst, int64_t n);
void bias_round_bf16(const float* y, const float* b, uint16_t* out, int64_t rows, int64_t cols);

// LayerNorm over rows of d: s = x (+ r when r is not null); y = (s - mean) * rstd * w + b, rstd = 1 /
// sqrt(var + eps) (biased variance; mean and variance accumulated in double). w and b may be null.
// stats [rows, 3] keeps what the backward needs: the mean as two floats (hi, lo) and rstd; null:
// inference, nothing kept. xhat = ((s - hi) - lo) * rstd is not stored: the backward recomputes it
// from x and r, bit for bit. bf16 rows (bit patterns) in x16 / r16 / y16 take the place of x / r / y:
// a row is widened exactly into f32 and its f32 result rounded to nearest even once, the same bits as
// converting whole tensors before and after, without their passes over memory.
struct LayerNormForward {
  const float* x;
  const float* r;
  const float* w;
  const float* b;
  float* y;
  float* stats;
  int64_t rows, d;
  double eps;
  const uint16_t* x16 = nullptr;
  const uint16_t* r16 = nullptr;
  uint16_t* y16 = nullptr;
};
void layer_norm_forward(const LayerNormForward& p);

// The backward of that, on the forward's x / r (or x16 / r16) and stats: g = dy (+ dy2 when not
// null); dh = g * w; dx = rstd * (dh - mean(dh) - xhat * mean(dh * xhat)); dw += sum over rows of g *
// xhat, db += sum of g (when not null).
struct LayerNormBackward {
  const float* dy;
  const float* dy2;
  const float* x;
  const float* r;
  const uint16_t* x16;
  const uint16_t* r16;
  const float* stats;
  const float* w;
  float* dx;
  float* dw;
  float* db;
  int64_t rows, d;
};
void layer_norm_backward(const LayerNormBackward& p);

// Inverted dropout (attn/nn/layers.h's Dropout) over one call's n elements: y = x * scale, scale =
// keep_scale where word e % 4 of Philox4x32-10(key = seed, counter = (e / 4 low, e / 4 high, call
// low, call high)) >= threshold, else 0. bf16 rows: the product in f32, rounded once. The same draw
// gives the backward's dx = dy * scale. x and y may be the same array.
struct DropoutDraw {
  uint64_t seed, call;
  uint32_t threshold;
  float keep_scale;
};
void dropout_f32(const DropoutDraw& d, const float* x, float* y, int64_t n);
void dropout_bf16(const DropoutDraw& d, const uint16_t* x, uint16_t* y, int64_t n);

// The f32 product of a Linear with few rows, y [M, N] = x [M, K] w [N, K]^T (+ b [N] when b is not
// null), all row-major and contiguous, w read in place (elementwise_dot_linear-inl.h): each output
// is one fixed chain of f32 operations, the same for any thread count and any M. Columns in chunks
// on attn's threads (one thread below ~1M multiply-adds).
struct DotLinear {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  int64_t M, N, K;
  const uint16_t* w16 = nullptr;  // instead of w: bf16 weights, widened exactly in registers
};
void linear_dot(const DotLinear& p);
// Whether linear_dot serves products of M rows: M <= kDotLinearRows on a target with FMA vectors
// (AVX2, AVX-512). detail::f32_linear_route narrows it by shape: the library GEMMs pack the weights
// on every call, costing more than the product at few rows (docs/PERFORMANCE.md, "Linear routes").
inline constexpr int64_t kDotLinearRows = 64;
bool linear_dot_route(int64_t M);

// The per-ISA kernels behind those: single-threaded over a range, one table per instruction set.
struct Kernels {
  void (*act_forward)(Activation a, const float* x, float* y, int64_t n);
  void (*act_backward)(Activation a, const float* x, const float* dy, float* dx, int64_t n);
  void (*bias_act_row)(Activation a, float* h, const float* b, float* y, int64_t cols);
  void (*bias_act_round_bf16_row)(Activation a, float* h, const float* b, int64_t cols);
  void (*erf)(const float* x, float* y, int64_t n);
  void (*widen_bf16)(const uint16_t* src, float* dst, int64_t n);
  void (*round_bf16)(const float* src, uint16_t* dst, int64_t n);
  void (*bias_round_bf16_row)(const float* y, const float* b, uint16_t* out, int64_t cols);
  // Rows [r0, r1) of p; `stage` holds d floats (s = x + r when bf16 rows give it), `sd` d doubles
  // (a row converted once for both statistics passes).
  void (*layer_norm_forward)(const LayerNormForward& p, int64_t r0, int64_t r1, float* stage,
                             double* sd);
  // Rows [r0, r1) of p; dw and db partial sums of those rows go to dw_part / db_part (length d);
  // `stage` holds 2 * d floats (x16 and r16 rows widened).
  void (*layer_norm_backward)(const LayerNormBackward& p, int64_t r0, int64_t r1, float* dw_part,
                              float* db_part, float* stage);
  void (*bias_act_bf16_row)(Activation a, float* h, const float* b, uint16_t* out, int64_t cols);
  // db (may be null) += this row's f32 products.
  void (*act_backward_bf16_row)(Activation a, const float* x, const uint16_t* dy, uint16_t* dx,
                                float* db, int64_t cols);
  void (*act_forward_bf16)(Activation a, const uint16_t* x, uint16_t* y, int64_t n);
  void (*add_bf16_row)(const uint16_t* src, float* acc, int64_t cols);  // acc += widened src
  // Elements [e0, e0 + n) of a dropout call (e0 a multiple of 4).
  void (*dropout_f32)(const DropoutDraw& d, const float* x, float* y, int64_t e0, int64_t n);
  void (*dropout_bf16)(const DropoutDraw& d, const uint16_t* x, uint16_t* y, int64_t e0, int64_t n);
  void (*linear_dot_cols)(const DotLinear& p, int64_t n0, int64_t n1);  // columns [n0, n1)
};

namespace portable {
extern const Kernels kernels;
}
namespace avx2 {
extern const Kernels kernels;
}
namespace avx512 {
extern const Kernels kernels;
}
// The table of active_isa(), for callers that run the row kernels inside loops of their own (the
// epilogue of the tile Linear product, nn/bf16.cc).
const Kernels& active_kernels();

}  // namespace attn::nn::ew
