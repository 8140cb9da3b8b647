// The cpu backend's kernels compiled for the avx2 target.
#define ATTN_CPU_ISA avx2
#define ATTN_CPU_WIDTH 8  // floats per vector
#define ATTN_CPU_TARGET_PRAGMA _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2\")")
#include "backends/cpu/kernels-inl.h"
