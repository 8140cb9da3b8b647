// attn's bf16 Linear product of few rows on VDPBF16PS, for the nn modules' bf16 products of at most
// a few dozen rows (nn/bf16.cc) on CPUs whose bf16 dot instruction pays: y [M, N] f32 =
// x [M, K] w [N, K]^T, bf16 in, f32 accumulation, both operands read where they are (no packing of
// w, which oneDNN's matmul does on every call and which, at 16 rows, it runs on one thread).
// Threaded over column chunks; each output one fixed chain, the same for any thread count and M.
#pragma once
#include <cstdint>
#include <optional>

#include "backends/cpu/attention_cpu.h"

namespace attn::cpu {

struct DotLinearBf16 {
  const uint16_t* x = nullptr;  // [M, K] bf16 bit patterns, row-major, contiguous
  const uint16_t* w = nullptr;  // [N, K] bf16 (a Linear's weight), row-major, contiguous
  float* y = nullptr;           // [M, N] f32, row-major, contiguous
  int64_t M = 0, N = 0, K = 0;
};

// The target dot_linear_bf16 runs on: the active target where it has VDPBF16PS (avx512bf16, amx),
// amx_emulated when that is the forced one (the tests); nullopt otherwise.
std::optional<Isa> dot_linear_bf16_isa();
void dot_linear_bf16(const DotLinearBf16& p, Isa isa);

}  // namespace attn::cpu
