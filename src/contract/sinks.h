// Learned attention sinks (AttentionOptions::sinks) around kernels that compute without them: a sink
// logit sink_h joins the softmax denominator of every row of head h and carries no value, so
//   lse' = log(exp(lse) + exp(sink_h)),  out' = out exp(lse - lse'),  weights' = weights exp(lse - lse')
// where lse, out and weights are the sink-free forward's. The backward of a forward with sinks is the
// ordinary one given lse' and out' (P_ij = exp(s_ij - lse'), D_i = dO_i . out'_i), plus the sinks' own
// gradient dsink_h = -sum_{b, i} exp(sink_h - lse'_bhi) D_bhi. The reference backend computes both
// directly (backends/reference/attention_ref.cc); these serve the cpu kernels.
#pragma once
#include <vector>

#include "contract/problem.h"

namespace attn::contract {

// Folds p.sinks into a sink-free forward in place of p.lse [B, Hq, Lq]: out_src / weights_src (the
// kernels' f32 or q-dtype results, [B, Hq, Lq, Dv] / [B, Hq, Lq, Lk] views) are scaled into
// out_dst / weights_dst (the same views or q-dtype ones: one rounding). weights_* may be undefined.
void fold_sinks(const ForwardProblem& p, const Tensor& out_src, const Tensor& out_dst,
                const Tensor& weights_src, const Tensor& weights_dst);

// dL/dsinks [Hq] in double from p.dout, p.out and p.lse (the forward's, sinks included).
std::vector<double> sink_gradient(const BackwardProblem& p);

}  // namespace attn::contract
