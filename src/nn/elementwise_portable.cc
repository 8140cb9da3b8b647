// attn::nn's element-wise kernels compiled for the baseline (SSE2 on x86-64; any 128-bit target).
#define ATTN_EW_ISA portable
#define ATTN_EW_WIDTH 4  // floats per vector
#include "nn/elementwise-inl.h"
