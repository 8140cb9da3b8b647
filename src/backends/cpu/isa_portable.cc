// The cpu backend's kernels compiled for the portable target.
#define ATTN_CPU_ISA portable
#define ATTN_CPU_WIDTH 4  // floats per vector
#include "backends/cpu/kernels-inl.h"
