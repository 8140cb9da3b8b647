// Packed variable-length attention (FlashAttention's varlen form): the tokens of B sequences of
// different lengths packed one after the other, no padding.
//
//   q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]
//     ->  out [total_q, Hq, Dv] (q's dtype), lse [Hq, total_q] (f64 for f64 inputs, else f32)
//
// Sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q (its Lq_b queries) and rows
// cu_seqlens_k[b] .. cu_seqlens_k[b+1] of k and v (its Lk_b keys); it attends to its own keys only,
// exactly as attention() on that sequence alone would (the same bits, the kernels read the packed
// rows in place: heads strided, no copy). Every option of AttentionOptions applies per sequence:
// alignment against Lq_b and Lk_b (bottom-right, the default, is the varlen convention: the queries
// are the last Lq_b of the keys), windows, scale, softcap, ALiBi ([Hq] or [B, Hq]), sinks, dropout
// (the keep-pattern of batch entry b, local i and j), GQA. Per-sequence masks take other forms here:
// key_lengths is seqused_k; dense masks, block layouts, return_weights and mask_grad are refused.
#pragma once
#include <cstdint>

#include "attn/attention.h"

namespace attn {

struct VarlenBatch {
  Tensor cu_seqlens_q;  // int32 [B + 1]: 0, then non-decreasing, last = total_q
  Tensor cu_seqlens_k;  // int32 [B + 1]: 0, then non-decreasing, last = total_k
  // Optional int32 [B]: sequence b uses only its first seqused_k[b] keys (<= Lk_b); the rest of its
  // rows are there (a cache's capacity) but never read.
  Tensor seqused_k;
  // Optional bounds (FlashAttention's arguments): -1 = not given; when given, every Lq_b (Lk_b) must
  // be <= it.
  int64_t max_seqlen_q = -1;
  int64_t max_seqlen_k = -1;
};

AttentionResult attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const VarlenBatch& batch, const AttentionOptions& options = {});

// Gradients of attention_varlen(q, k, v, batch, options).out given dout [total_q, Hq, Dv]; out and
// lse are that call's. dq, dk, dv are packed like q, k, v (rows of keys no sequence uses get 0);
// dsinks as attention_backward's. Deterministic: the same bits for any thread count.
AttentionGrads attention_varlen_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         const VarlenBatch& batch,
                                         const AttentionOptions& options = {});

}  // namespace attn
