// attn::nn's element-wise kernels compiled for AVX2 + FMA.
#define ATTN_EW_ISA avx2
#define ATTN_EW_WIDTH 8  // floats per vector
#define ATTN_EW_TARGET_PRAGMA _Pragma("GCC target(\"avx2,fma\")")
#include "nn/elementwise-inl.h"
