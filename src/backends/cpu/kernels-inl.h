// The whole kernel source of the cpu backend, compiled once per instruction set: isa_<name>.cc
// defines ATTN_CPU_ISA (the namespace) and includes this file; CMakeLists.txt gives each of them
// its target flags.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/parallel.h"

#ifndef ATTN_CPU_ISA
#error "define ATTN_CPU_ISA (the namespace of this instruction set) before including kernels-inl.h"
#endif

namespace attn::cpu::ATTN_CPU_ISA {

// clang-format off
#include "backends/cpu/simd-inl.h"
#include "backends/cpu/microkernels-inl.h"
#include "backends/cpu/online_softmax-inl.h"
#include "backends/cpu/attention_fwd-inl.h"
#include "backends/cpu/attention_bwd-inl.h"
#include "backends/cpu/probes-inl.h"
// clang-format on

void forward(const contract::ForwardProblem& p) {
  forward_impl(p);
}
void backward(const contract::BackwardProblem& p) {
  backward_impl(p);
}

}  // namespace attn::cpu::ATTN_CPU_ISA
