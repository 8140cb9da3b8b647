// The cpu backend's kernels compiled for the amx target: the avx512bf16 kernels with the products of
// bf16 pairs whose A is row-major on AMX-BF16 tiles (amx_tiles-inl.h), the hardware instructions.
#define ATTN_CPU_ISA amx
#define ATTN_CPU_WIDTH 16  // floats per vector
#define ATTN_CPU_BF16_DOT 1
#define ATTN_CPU_AMX 1
// clang-format off
#define ATTN_CPU_TARGET_PRAGMA _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c,bmi,bmi2\")")
// clang-format on
#include "backends/cpu/kernels-inl.h"
