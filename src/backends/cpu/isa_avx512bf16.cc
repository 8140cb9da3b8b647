// The cpu backend's kernels compiled for the avx512bf16 target: the avx512 kernels, plus products
// of bf16 inputs on VDPBF16PS (bf16_dot-inl.h) instead of converting them to f32 for the FMAs.
#define ATTN_CPU_ISA avx512bf16
#define ATTN_CPU_WIDTH 16  // floats per vector
#define ATTN_CPU_BF16_DOT 1
#define ATTN_CPU_TARGET_PRAGMA \
  _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2\")")
#include "backends/cpu/kernels-inl.h"
