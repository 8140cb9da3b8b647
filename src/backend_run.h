// Runs a validated problem (contract/problem.h) on the backend chosen for it, with what each entry
// point (src/attention.cc, src/attention_varlen.cc) adds around the kernels: the sinks, which the cpu
// kernels do not compute (contract/sinks.h).
#pragma once
#include <vector>

#include "attn/attention.h"
#include "contract/problem.h"

namespace attn::detail {

// The forward into p.out, p.lse and (when defined) p.weights.
void run_forward(Backend backend, contract::ForwardProblem& p);

// The backward into p.dq, p.dk, p.dv (and p.dscores); returns dL/dsinks [Hq] in double, summed
// over the batch in a fixed order (empty without sinks).
std::vector<double> run_backward(Backend backend, contract::BackwardProblem& p);

}  // namespace attn::detail
