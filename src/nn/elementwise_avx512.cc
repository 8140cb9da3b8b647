// attn::nn's element-wise kernels compiled for AVX-512 (F, VL, BW, DQ).
#define ATTN_EW_ISA avx512
#define ATTN_EW_WIDTH 16  // floats per vector
#define ATTN_EW_TARGET_PRAGMA _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx2,fma\")")
#include "nn/elementwise-inl.h"
