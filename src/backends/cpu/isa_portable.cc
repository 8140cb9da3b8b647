// The cpu backend's kernels compiled for the portable target (flags in CMakeLists.txt).
#define ATTN_CPU_ISA portable
#include "backends/cpu/kernels-inl.h"
