// The cpu backend's kernels compiled for the amx_emulated target: the amx target's kernels with the
// tile layer emulated in software (amx_tiles-inl.h), bit for bit the instructions' documented
// results, and VDPBF16PS / VCVTNEPS2BF16 computed in software too (bf16_dot-inl.h), on 16-lane
// vectors that GCC lowers to pairs of AVX2 registers. So it runs on every AVX2 CPU (a Zen 3 as a
// Xeon), and the AMX kernels' tiling, packing and edges are tested on machines without AMX or
// AVX-512; only tests and benchmarks that ask for it use it.
#define ATTN_CPU_ISA amx_emulated
#define ATTN_CPU_WIDTH 16  // floats per vector
#define ATTN_CPU_BF16_DOT 1
#define ATTN_CPU_SOFT_BF16 1
#define ATTN_CPU_AMX 1
#define ATTN_CPU_AMX_EMULATED 1
#define ATTN_CPU_TARGET_PRAGMA _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2\")")
// Built with -Wno-psabi (CMakeLists.txt): 64-byte vector arguments without AVX-512.
#include "backends/cpu/kernels-inl.h"
