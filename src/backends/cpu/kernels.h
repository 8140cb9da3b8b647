// Internals of the cpu backend shared by its per-ISA translation units (isa_*.cc compile the same
// kernel sources once per instruction set, each into its own namespace) and by the dispatcher
// (attention_cpu.cc).
#pragma once
#include <cstdint>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/dot_linear_bf16.h"
#include "backends/cpu/tile_linear.h"
#include "contract/problem.h"

namespace attn::cpu {

// Query rows x keys of one tile. Chosen by head dim (the packed K^T panel, the S tile and the V
// tile must sit in L2 next to each other) and by what runs the products: bf16 pairs (VDPBF16PS or
// AMX tiles), and AMX tiles in particular (amx_tiles); bench/ sweeps them through
// set_tile_override.
struct TileSizes {
  int64_t bq = 0, bk = 0;
};
TileSizes tile_sizes(int64_t D, int64_t Dv, bool backward, bool bf16_pairs = false,
                     bool amx_tiles = false);

// The cache level decode's software prefetch (prefetch_ahead.h) fills, chosen per CPU once per
// process (decode_prefetch_level in attention_cpu.cc, overridable for benchmarks' sweeps).
enum class PrefetchLevel : uint8_t { l1, l2, none };  // none: the hardware prefetchers alone
PrefetchLevel decode_prefetch_level();

// Whether the forward's bf16 products on AMX tiles are pipelined against the softmax
// (amx_pipeline-inl.h): off unless set_amx_pipeline_override("on"). Measured on an AMX Xeon
// (docs/PERFORMANCE.md, "AMX pipeline"): from 6% slower to 4% faster than unpipelined, so it
// stays off.
bool amx_pipeline();

// Fewer row tasks than this (forward) or (batch, kv head) pairs (backward) and the keys are split
// into chunks whose results are merged in a fixed order. A constant, not the thread count, so that
// results are bitwise the same for any number of threads.
inline constexpr int64_t kSplitMinTasks = 8;

#define ATTN_CPU_DECLARE_ISA(ns)                                \
  namespace ns {                                                \
  void forward(const contract::ForwardProblem& p);              \
  void backward(const contract::BackwardProblem& p);            \
  bool decode_shaped(const contract::ForwardProblem& p);        \
  double fma_probe_flops(int64_t iters);                        \
  uint32_t read_probe_sum(const uint32_t* w, int64_t n);        \
  void exp_rows(const float* x, int64_t n, float* y);           \
  void exp2_rows_for_bf16(const float* x, int64_t n, float* y); \
  void store_bf16_row(const float* x, int64_t n, uint16_t* y);  \
  }
ATTN_CPU_DECLARE_ISA(portable)
#if defined(__x86_64__)
ATTN_CPU_DECLARE_ISA(avx2)
ATTN_CPU_DECLARE_ISA(avx512)
ATTN_CPU_DECLARE_ISA(avx512bf16)
ATTN_CPU_DECLARE_ISA(amx)
ATTN_CPU_DECLARE_ISA(amx_emulated)
#endif
#undef ATTN_CPU_DECLARE_ISA

// One target's entry points (the functions ATTN_CPU_DECLARE_ISA declares): the dispatcher and the
// probes pick a row of attention_cpu.cc's target table instead of switching over the targets.
struct IsaKernels {
  void (*forward)(const contract::ForwardProblem& p) = nullptr;
  void (*backward)(const contract::BackwardProblem& p) = nullptr;
  bool (*decode_shaped)(const contract::ForwardProblem& p) = nullptr;
  double (*fma_probe_flops)(int64_t iters) = nullptr;
  // The wrapping sum of n words: the read probe's loop on this target's vectors.
  uint32_t (*read_probe_sum)(const uint32_t* w, int64_t n) = nullptr;
  // y[i] = the softmax's vexp(x[i]), n a multiple of 16 (the tests of its accuracy).
  void (*exp_rows)(const float* x, int64_t n, float* y) = nullptr;
  // y[i] = vexp2_for_bf16(x[i]) (2^x for a P rounded to bf16 next), n a multiple of 16.
  void (*exp2_rows_for_bf16)(const float* x, int64_t n, float* y) = nullptr;
  // y[0, n) = the bf16 bits of x as the kernels write their bf16 results (store_row), any n.
  void (*store_bf16_row)(const float* x, int64_t n, uint16_t* y) = nullptr;
};
// The entry points of `isa` (a target this build compiled; portable for any other).
const IsaKernels& kernels_of(Isa isa);

#if defined(__x86_64__)
// The amx targets' tile product (gemm_tiles, amx_tiles-inl.h), for the tests of the tile layer:
// C[M x N] (=, +=) A[M x K2 bf16 pairs, row stride lda words] B[K2 pair-rows x N], N a multiple of
// 16, column c of pair-row k of B at B + (c / 16) * bcs + k * ldb + c % 16 (bcs = 16: row-major).
#define ATTN_CPU_DECLARE_TILE_GEMM(ns)                                                          \
  namespace ns {                                                                                \
  void tile_gemm(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t lda,              \
                 const uint32_t* B, int64_t ldb, int64_t bcs, float* C, int64_t ldc, bool acc); \
  }
ATTN_CPU_DECLARE_TILE_GEMM(amx)
ATTN_CPU_DECLARE_TILE_GEMM(amx_emulated)
#undef ATTN_CPU_DECLARE_TILE_GEMM

// Rows [m0, m1) of tile_linear's product (tile_linear-inl.h): x [M, K] bf16 row-major, the weights
// packed by tile_linear_pack (column block c of 16 outputs at packed + c * bcs: K2p pair-rows of 16
// words, word j of pair-row k = (w[n][2k], w[n][2k + 1]) of n = 16 c + j, low half first;
// K2p = K / 2 rounded up to 16, zero past N and K).
struct TileLinearRows {
  int64_t N = 0, K = 0;
  const uint16_t* x = nullptr;
  const uint32_t* packed = nullptr;
  int64_t bcs = 0;
  int64_t m0 = 0, m1 = 0;
  const float* bias = nullptr;  // TileLinear's outputs
  uint16_t* y16 = nullptr;
  float* y32 = nullptr;
  TileLinearRowFn row_fn = nullptr;
  const void* row_ctx = nullptr;
};
#define ATTN_CPU_DECLARE_TILE_LINEAR(ns)                                                  \
  namespace ns {                                                                          \
  void tile_linear_rows(const TileLinearRows& p);                                         \
  void tile_linear_pack(const uint16_t* w, int64_t N, int64_t K, int64_t K2p, int64_t nb, \
                        uint32_t* out);                                                   \
  }
ATTN_CPU_DECLARE_TILE_LINEAR(amx)
ATTN_CPU_DECLARE_TILE_LINEAR(amx_emulated)
#undef ATTN_CPU_DECLARE_TILE_LINEAR
// Columns [n0, n1) of dot_linear_bf16's product (dot_linear_bf16-inl.h), on the targets with
// VDPBF16PS.
#define ATTN_CPU_DECLARE_DOT_LINEAR_BF16(ns)                                 \
  namespace ns {                                                             \
  void dot_linear_bf16_cols(const DotLinearBf16& p, int64_t n0, int64_t n1); \
  }
ATTN_CPU_DECLARE_DOT_LINEAR_BF16(avx512bf16)
ATTN_CPU_DECLARE_DOT_LINEAR_BF16(amx)
ATTN_CPU_DECLARE_DOT_LINEAR_BF16(amx_emulated)
#undef ATTN_CPU_DECLARE_DOT_LINEAR_BF16
namespace amx {
double tile_probe_flops(int64_t iters);  // iters x 4 TDPBF16PS on full 16 x 16 x 32 tiles
}
#endif

}  // namespace attn::cpu
