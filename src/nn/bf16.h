// bf16 compute for the nn modules built with dtype bf16 (inference): parameters and the activations
// passed between modules are bf16; every product accumulates in f32 and every LayerNorm / softmax
// keeps its statistics in f32 (wider, as autocast does). The products take one of two paths, chosen
// once per process from what the CPU and oneDNN offer (bf16_gemm_path() names it):
//   onednn  oneDNN's bf16 matmul (brgemm on AVX512_BF16 / AMX tiles), bf16 in, f32 accumulation,
//           used where bf16 instructions pay (AMX tiles, or VDPBF16PS at over 1.5x the FMA rate:
//           cpu::bf16_instructions_pay, the rule the attention kernels follow), its implementation
//           is not oneDNN's reference code and a small product agrees with the f32 path;
//   f32     bf16 -> f32 exactly (a shift), oneDNN sgemm, the result rounded once to bf16: on a CPU
//           without a bf16 dot instruction (AVX2), or whose VDPBF16PS is slower than its FMAs (Intel
//           Xeons without AMX: a 4096 x 1536 x 384 product 1.4x faster here than on VDPBF16PS).
// ATTN_BF16_GEMM=f32 forces the second path; ATTN_BF16_GEMM=onednn asks for the first whatever the
// rates (and falls back, saying why in the path string, when it is not available).
// Where the CPU has AMX tiles (cpu::tile_linear_isa: the amx target, or amx-emulated when forced),
// a Linear's forward product of 1024 rows or more (gemm_bf16) runs on attn's own tile product
// instead (backends/cpu/tile_linear.h: 1.13-1.31x oneDNN 2.6.3's AMX matmul on BERT's 4096-row
// shapes, 2 threads; bias, activation and rounding fused); ATTN_BF16_GEMM=onednn or f32 turns that
// off, =tiles takes it for every product. ATTN_BF16_GEMM is read and parsed once (bf16.cc); a value
// that names none of these paths is an error naming it, raised by every bf16 product.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "attn/nn/layers.h"
#include "attn/tensor.h"

namespace attn::nn::detail {

// x (any floating dtype and layout) as a contiguous tensor of `dtype`; fast for f32 <-> bf16, no
// copy when x already is one.
Tensor convert(const Tensor& x, DType dtype);

// The bf16 product of a Linear: y [M, N] = x [M, K] w [N, K]^T (+ bias [N], bf16), f32
// accumulation, all row-major and contiguous. The result is either rounded to bf16 (y16) or kept in
// f32 (y32, for a fused bias + activation pass after it); exactly one of them is non-null.
struct Bf16Gemm {
  int64_t M = 0, N = 0, K = 0;
  const uint16_t* x = nullptr;
  // Instead of x: f32 rows whose every value is a bf16 one (ew::bias_act_round_bf16's), read as they
  // are by the f32 path (no widening pass) and rounded, exactly, by the onednn path.
  const float* x32 = nullptr;
  const uint16_t* w = nullptr;
  const uint16_t* bias = nullptr;
  uint16_t* y16 = nullptr;
  float* y32 = nullptr;
  // An activation applied in f32 to the product (+ bias) before it is rounded to y16, inside
  // oneDNN's matmul (an eltwise post-op, oneDNN's own function) or in the tile product's epilogue
  // (ew's bias_act_bf16_row: float lanes for bf16 results): the FFN's first product then writes bf16
  // once instead of f32 [M, N] and two more passes. Only where bf16_fuses_activations(), with y16.
  std::optional<Activation> activation = std::nullopt;
};
void gemm_bf16(const Bf16Gemm& g);

// The backward's bf16 products: c [M, N] = op(a) op(b), or c += op(a) op(b) (accumulate, f32 c
// only), f32 accumulation; a [M, K] row-major (stored [K, M] when a_km), b [K, N] (stored [N, K]
// when b_nk). The result in f32 (c32) or rounded once to bf16 (c16); exactly one is non-null. The
// onednn path runs oneDNN's bf16 matmul on the stored layouts; the f32 path widens a and b and runs
// sgemm.
struct Bf16Product {
  int64_t M = 0, N = 0, K = 0;
  const uint16_t* a = nullptr;
  bool a_km = false;
  const uint16_t* b = nullptr;
  bool b_nk = false;
  float* c32 = nullptr;
  uint16_t* c16 = nullptr;
  bool accumulate = false;
};
void product_bf16(const Bf16Product& p);

// The backward of a bf16 product y [N, out] = x [N, in] w [out, in]^T (+ b): dx = dy w, rounded to
// bf16 (dx16) or kept in f32 (dx32); gw [out, in] += dy^T x, accumulated in f32 into the f32
// gradient; gb [out] += the column sums of dy in f32 (of dy32 when given: the gradient before its
// rounding to dy). gb may be null.
struct Bf16LinearBackward {
  int64_t N = 0, in = 0, out = 0;
  const uint16_t* dy = nullptr;
  const float* dy32 = nullptr;
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  float* gw = nullptr;
  float* gb = nullptr;
  float* dx32 = nullptr;
  uint16_t* dx16 = nullptr;
};
void linear_backward_bf16(const Bf16LinearBackward& b);

// "onednn" or "f32" (see above), and the sentence gemm_kernels() prints for bf16.
bool bf16_gemm_native();
// Whether gemm_bf16 takes an activation (the tile product, or the onednn path).
bool bf16_fuses_activations();
std::string bf16_gemm_path();

}  // namespace attn::nn::detail
