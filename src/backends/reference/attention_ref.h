// The reference backend: straight from the formula, in double, every option of the contract. It defines
// correct behaviour; every other backend is tested against it.
#pragma once
#include "contract/problem.h"

namespace attn::reference {

void forward(const contract::ForwardProblem& p);
void backward(const contract::BackwardProblem& p);

}  // namespace attn::reference
