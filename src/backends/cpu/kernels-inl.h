// The whole kernel source of the cpu backend, compiled once per instruction set: isa_<name>.cc
// defines ATTN_CPU_ISA (the namespace), ATTN_CPU_WIDTH (floats per vector) and, for x86 targets,
// ATTN_CPU_TARGET_PRAGMA, and includes this file.
//
// The target is switched on with `#pragma GCC target` *after* every shared header, not with -m
// flags for the whole file: inline functions and templates that other files also use (Tensor, the
// contract's PositionRule, std::vector, std::fill, ...) are then compiled for the baseline here
// too, so the linker cannot keep an AVX-512 copy of one of them that the portable path would run on
// an older processor. (GCC inlines those baseline functions into the kernels; the reverse never
// happens.)
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>  // AVX-512 intrinsics where vector extensions have no form (VSCALEFPS, bf16)
#endif

#include "backends/cpu/kernels.h"
#include "backends/cpu/prefetch_ahead.h"
#include "core/dot_form.h"
#include "core/parallel.h"

#ifndef ATTN_CPU_ISA
#error "define ATTN_CPU_ISA (the namespace of this instruction set) before including kernels-inl.h"
#endif

#if defined(ATTN_CPU_TARGET_PRAGMA) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
ATTN_CPU_TARGET_PRAGMA
#define ATTN_CPU_POP_TARGET
#endif

namespace attn::cpu::ATTN_CPU_ISA {

// clang-format off
#include "backends/cpu/simd-inl.h"
#include "backends/cpu/scratch-inl.h"
#include "backends/cpu/microkernels-inl.h"
#include "backends/cpu/amx_tiles-inl.h"
#include "backends/cpu/tile_linear-inl.h"
#include "backends/cpu/online_softmax-inl.h"
#include "backends/cpu/decode_scores-inl.h"
#include "backends/cpu/decode_pv-inl.h"
#include "backends/cpu/attention_decode-inl.h"
#include "backends/cpu/bf16_dot-inl.h"
#include "backends/cpu/dot_linear_bf16-inl.h"
#include "backends/cpu/attention_fwd-inl.h"
#include "backends/cpu/amx_pipeline-inl.h"
#include "backends/cpu/attention_fwd_tasks-inl.h"
#include "backends/cpu/attention_bwd-inl.h"
#include "backends/cpu/probes-inl.h"
// clang-format on

void forward(const contract::ForwardProblem& p) {
  if (p.pages.table != nullptr && !Decode::handles(p)) {
    throw Error("attn::cpu: keys in pages reach the decode kernel only (cpu::reads_pages)");
  }
  forward_impl(p);
}
void backward(const contract::BackwardProblem& p) {
  backward_impl(p);
}
// Whether forward() runs p on the decode kernel (attention_decode-inl.h) rather than the tiles.
bool decode_shaped(const contract::ForwardProblem& p) {
  return p.B > 0 && p.Hq > 0 && p.Lq > 0 && Decode::handles(p);
}

void exp_rows(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += W) store(y + i, vexp(load(x + i)));
}
void exp2_rows_for_bf16(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += W) store(y + i, vexp2_for_bf16(load(x + i)));
}
void store_bf16_row(const float* x, int64_t n, uint16_t* y) {
  store_row(x, n, DType::bf16, y);
}

#if defined(ATTN_CPU_AMX)
void tile_gemm(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, int64_t bcs, float* C, int64_t ldc, bool acc) {
  if (acc) {
    gemm_tiles<true>(M, N, K2, A, lda, B, ldb, bcs, C, ldc);
  } else {
    gemm_tiles<false>(M, N, K2, A, lda, B, ldb, bcs, C, ldc);
  }
}
#endif

#if defined(ATTN_CPU_AMX) && !defined(ATTN_CPU_AMX_EMULATED)
// The AMX ceiling of `attn bench`: 4 independent accumulator tiles, A and B tiles loaded once.
double tile_probe_flops(int64_t iters) {
  alignas(64) static const uint32_t ones[kTileRows * kTilePairs] = {};
  const TileScope scope;
  tile_zero<0>(), tile_zero<1>(), tile_zero<2>(), tile_zero<3>();
  tile_load<4>(ones, kTileBytes), tile_load<5>(ones, kTileBytes);
  tile_load<6>(ones, kTileBytes), tile_load<7>(ones, kTileBytes);
  for (int64_t it = 0; it < iters; ++it) {
    tile_dp_bf16<0, 4, 6>(), tile_dp_bf16<1, 4, 7>();
    tile_dp_bf16<2, 5, 6>(), tile_dp_bf16<3, 5, 7>();
  }
  alignas(64) float sink[kTileRows * W];
  tile_store<0>(sink, kTileBytes);
  return 4.0 * 2.0 * kTileRows * W * 2 * kTilePairs * static_cast<double>(iters);
}
#endif

}  // namespace attn::cpu::ATTN_CPU_ISA

#if defined(ATTN_CPU_POP_TARGET)
#pragma GCC pop_options
#undef ATTN_CPU_POP_TARGET
#endif
