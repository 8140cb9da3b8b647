// Internals of the cpu backend shared by its per-ISA translation units (isa_*.cc compile the same
// kernel sources once per instruction set, each into its own namespace) and by the dispatcher
// (attention_cpu.cc).
#pragma once
#include <cstdint>

#include "contract/problem.h"

namespace attn::cpu {

// Query rows x keys of one tile. Chosen by head dim (the packed K^T panel, the S tile and the V
// tile must sit in L2 next to each other); bench/ sweeps them through set_tile_override.
struct TileSizes {
  int64_t bq = 0, bk = 0;
};
TileSizes tile_sizes(int64_t D, int64_t Dv, bool backward, bool bf16_pairs = false);

// Fewer row tasks than this (forward) or (batch, kv head) pairs (backward) and the keys are split
// into chunks whose results are merged in a fixed order. A constant, not the thread count, so that
// results are bitwise the same for any number of threads.
inline constexpr int64_t kSplitMinTasks = 8;

#define ATTN_CPU_DECLARE_ISA(ns)                     \
  namespace ns {                                     \
  void forward(const contract::ForwardProblem& p);   \
  void backward(const contract::BackwardProblem& p); \
  double fma_probe_flops(int64_t iters);             \
  }
ATTN_CPU_DECLARE_ISA(portable)
#if defined(__x86_64__)
ATTN_CPU_DECLARE_ISA(avx2)
ATTN_CPU_DECLARE_ISA(avx512)
ATTN_CPU_DECLARE_ISA(avx512bf16)
#endif
#undef ATTN_CPU_DECLARE_ISA

}  // namespace attn::cpu
