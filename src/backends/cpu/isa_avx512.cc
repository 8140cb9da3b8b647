// The cpu backend's kernels compiled for the avx512 target.
#define ATTN_CPU_ISA avx512
#define ATTN_CPU_WIDTH 16  // floats per vector
#define ATTN_CPU_TARGET_PRAGMA \
  _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,bmi,bmi2\")")
#include "backends/cpu/kernels-inl.h"
