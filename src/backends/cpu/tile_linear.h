// attn's own bf16 Linear product on AMX-BF16 tiles, for the nn modules' bf16 products (nn/bf16.cc):
// y [M, N] = x [M, K] w [N, K]^T (+ bias), bf16 in, f32 accumulation on the tiles, the bias added
// and the result rounded (or not) from each finished block while it is in L1, so y is written once.
// Measured against oneDNN 2.6.3's AMX matmul (docs/PERFORMANCE.md, "tile_linear"). Runs on the amx
// target (the hardware tiles) or amx_emulated (the tests, on any AVX2 CPU); every result is the
// same f32 chain on both and for any thread count.
#pragma once
#include <cstdint>
#include <optional>

#include "backends/cpu/attention_cpu.h"

namespace attn::cpu {

// Finishes one row of a block in place of the bias and rounding: row holds the f32 products of
// columns [n0, n0 + cols) (it may be overwritten), out the bf16 row of y16 they go to. Called from
// the worker threads, between the next block's tile products.
using TileLinearRowFn = void (*)(const void* ctx, float* row, int64_t n0, uint16_t* out,
                                 int64_t cols);

struct TileLinear {
  int64_t M = 0, N = 0, K = 0;  // >= 0
  const uint16_t* x = nullptr;  // [M, K] bf16 bit patterns, row-major, contiguous
  const uint16_t* w = nullptr;  // [N, K] bf16 (a Linear's weight), row-major, contiguous
  const float* bias = nullptr;  // [N], added in f32 to the product; may be null
  // The result [M, N] (row-major, contiguous), exactly one of: product + bias rounded to bf16
  // (nearest even, NaN quiet: attn::f32_to_bf16's bits), or product + bias in f32.
  uint16_t* y16 = nullptr;
  float* y32 = nullptr;
  // With y16 and no bias only: each row of results finished by row_fn (the caller's bias and
  // activation) instead of the bias added and rounded here.
  TileLinearRowFn row_fn = nullptr;
  const void* row_ctx = nullptr;
  int threads = 0;  // <= 0: attn's default (one thread for a small product)
};

// The target tile_linear runs on: amx where the CPU has usable AMX-BF16 tiles and the active target
// (cpu::active_isa(): forced, ATTN_CPU_ISA, or the best) is amx; amx_emulated when that is the
// forced one; nullopt otherwise (no tiles: the caller takes another path).
std::optional<Isa> tile_linear_isa();
// Runs p on `isa` (amx or amx_emulated): packs w into the tiles' pair-interleaved column blocks
// once per call (in parallel), then the row blocks in parallel.
void tile_linear(const TileLinear& p, Isa isa);

}  // namespace attn::cpu
