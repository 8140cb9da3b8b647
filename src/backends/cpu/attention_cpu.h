// The fast CPU backend: flash-style tiled kernels (f32 / bf16 / f16 inputs, fp32 accumulation) with
// runtime ISA dispatch.
#pragma once
#include "contract/problem.h"

namespace attn::cpu {

// Whether this backend can run problems of `dtype` (f64 problems go to the reference backend).
bool supports(DType dtype);
void forward(const contract::ForwardProblem& p);
void backward(const contract::BackwardProblem& p);

}  // namespace attn::cpu
