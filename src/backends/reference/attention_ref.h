// The reference backend: straight from the formula, in double, every option of the contract. It defines
// correct behaviour; every other backend is tested against it.
#pragma once
#include "contract/problem.h"

namespace attn::reference {

void forward(const contract::ForwardProblem& p);
void backward(const contract::BackwardProblem& p);
// Linear attention (contract::LinearProblem): out [B, Hq, Lq, Dv] written; the backward writes p.dq,
// p.dk, p.dv (zero-filled by the caller).
void linear_forward(const contract::LinearProblem& p, const Tensor& out);
void linear_backward(const contract::LinearBackwardProblem& p);

}  // namespace attn::reference
