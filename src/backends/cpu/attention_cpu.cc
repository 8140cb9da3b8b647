#include "backends/cpu/attention_cpu.h"

namespace attn::cpu {
// Placeholder until the fast kernels land: automatic resolves to the reference backend.
bool supports(DType) { return false; }
void forward(const contract::ForwardProblem&) { throw Error("attn::cpu::forward: unavailable"); }
void backward(const contract::BackwardProblem&) { throw Error("attn::cpu::backward: unavailable"); }
}  // namespace attn::cpu
