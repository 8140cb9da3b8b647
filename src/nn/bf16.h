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
  // oneDNN's matmul (an eltwise post-op, oneDNN's own function): the FFN's first product then writes
  // bf16 once instead of f32 [M, N] and two more passes. Only on the onednn path
  // (bf16_gemm_native()) and with y16.
  std::optional<Activation> activation = std::nullopt;
};
void gemm_bf16(const Bf16Gemm& g);

// "onednn" or "f32" (see above), and the sentence gemm_kernels() prints for bf16.
bool bf16_gemm_native();
std::string bf16_gemm_path();

}  // namespace attn::nn::detail
