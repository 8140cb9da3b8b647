// The cpu backend's kernels compiled for the avx2 target (flags in CMakeLists.txt).
#define ATTN_CPU_ISA avx2
#include "backends/cpu/kernels-inl.h"
