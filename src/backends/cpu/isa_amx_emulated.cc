// The cpu backend's kernels compiled for the amx_emulated target: the amx target's kernels with the
// tile layer emulated in software (amx_tiles-inl.h), bit for bit the instructions' documented
// results. It runs wherever avx512bf16 runs, so the AMX kernels' tiling, packing and edges are
// tested on machines without AMX; only tests and benchmarks that ask for it use it.
#define ATTN_CPU_ISA amx_emulated
#define ATTN_CPU_WIDTH 16  // floats per vector
#define ATTN_CPU_BF16_DOT 1
#define ATTN_CPU_AMX 1
#define ATTN_CPU_AMX_EMULATED 1
#define ATTN_CPU_TARGET_PRAGMA \
  _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2\")")
#include "backends/cpu/kernels-inl.h"
