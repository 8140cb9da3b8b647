// Linear attention (Katharopoulos et al. 2020) with the feature map phi(x) = elu(x) + 1 > 0:
//
//   out_i = phi(q_i)^T S_i / (phi(q_i) . z_i),  S_i = sum_{j in K(i)} phi(k_j) v_j^T,
//   z_i = sum_{j in K(i)} phi(k_j)
//
// where K(i) is the set of keys query i may use: every key the padding options keep and, with
// causal, only keys j <= p(i) (p(i) as in attn::attention: i + Lk - Lq bottom-right, i top-left).
// No scale, no softmax: the cost is O(L D Dv) instead of O(L^2 D). Computed in double, stored in
// the inputs' dtype. docs/semantics.md "Linear attention" states the contract.
//
//   q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]  ->  out [B, Hq, Lq, Dv]
//
// Exactly 4-D, one dtype (f32 or f64), Hq % Hkv == 0: query head h reads kv head h / (Hq / Hkv).
// Lq != Lk and Dv != D are normal; any strides (non-contiguous inputs are copied). A query with no
// usable key (K(i) empty: every key padded, Lk == 0, or causal before the first key) gives
// out_i = 0 and zero gradients, as attn::attention's fully masked rows.
#pragma once
#include "attn/attention.h"
#include "attn/tensor.h"

namespace attn {

struct LinearAttentionOptions {
  bool causal = false;
  Align align = Align::bottom_right;  // where query i sits among the keys (causal only)
  // Key padding, either or both (a key is used when every given one allows it):
  //   key_lengths: i32 or i64 [B], keys j >= key_lengths[b] are padding (as attn::attention);
  //   key_keep: bool [B, Lk], true = use the key (the polarity of MaskType::keep).
  Tensor key_lengths;
  Tensor key_keep;
  int threads = 0;  // <= 0: attn::set_num_threads, ATTN_NUM_THREADS, or all cores
};

struct LinearAttentionGrads {
  Tensor dq, dk, dv;  // shapes and dtypes of q, k, v; dk, dv summed over a group's query heads
};

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const LinearAttentionOptions& options = {});

// Gradients of linear_attention(q, k, v, options) given dout = dL/dout [B, Hq, Lq, Dv] (the dtype
// of q). Nothing is saved between the calls: the backward rebuilds the running sums (O(L) memory).
LinearAttentionGrads linear_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v,
                                               const LinearAttentionOptions& options = {});

}  // namespace attn
