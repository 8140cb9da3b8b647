// The cpu backend's kernels compiled for the avx512 target (flags in CMakeLists.txt).
#define ATTN_CPU_ISA avx512
#include "backends/cpu/kernels-inl.h"
