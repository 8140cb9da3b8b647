// Linear attention (Katharopoulos et al. 2020) with the feature map phi(x) = elu(x) + 1:
//   out_i = phi(q_i)^T S / (phi(q_i) . z),  S = sum_j phi(k_j) v_j^T [D, Dv],  z = sum_j phi(k_j)
//   [D]
// over all keys (non-causal) or keys j <= i (causal, top-left). Padded keys are skipped. Memory is
// O(L): the backward recomputes the running sums instead of storing them per position. Shapes: q
// [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv], contiguous, one dtype (f32 or f64); query
// head h reads kv head h / (Hq / Hkv). key_keep: [B * Lk] (1 = use the key) or empty = all.
#pragma once
#include <cstdint>
#include <vector>

#include "attn/tensor.h"

namespace attn::nn::detail {

Tensor linear_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const std::vector<uint8_t>& key_keep, bool causal, int threads);
// dout [B, Hq, Lq, Dv] -> dq, dk, dv (dk, dv summed over the query heads of a group).
void linear_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const std::vector<uint8_t>& key_keep, bool causal,
                               int threads, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace attn::nn::detail
