// Attention over a paged KV cache: keys and values live in a pool of fixed-size blocks, and each
// sequence's block table lists the blocks that hold its keys in order (the layout of FlashAttention's
// and vLLM's paged kernels, so their tensors are read in place).
//
//   q [total_q, Hq, D]                     the queries of B sequences, packed (cu_seqlens_q), or
//                                          [B, Hq, D] with one query per sequence (decode)
//   k_pages [num_blocks, block_size, Hkv, D], v_pages [num_blocks, block_size, Hkv, Dv]
//   block_table int32 [B, max_blocks]      key j of sequence b is row j % block_size of block
//                                          block_table[b, j / block_size]
//   seqused_k int32 [B]                    the keys of sequence b: 0 .. seqused_k[b] - 1
//     ->  out [total_q, Hq, Dv] (q's dtype), lse [Hq, total_q]
//
// Sequence b's queries attend to its seqused_k[b] keys as attention() would on those keys gathered
// into one tensor; with the default bottom-right alignment its Lq_b queries are the last Lq_b keys
// (the keys of a decode step or a prefill chunk are appended before the call). Any number of queries
// per sequence: decode (1), speculative (k), chunked prefill. Every AttentionOptions field applies per
// sequence but key_lengths (seqused_k), dense masks, block layouts, return_weights and mask_grad;
// ALiBi slopes may be [Hq] or [B, Hq]. Forward only.
//
// Quantized pools: int8 k_pages / v_pages with k_scales / v_scales f32 [num_blocks, block_size,
// Hkv], one scale per (token, kv head): element (n, t, h, d) stands for k_pages[n, t, h, d] *
// k_scales[n, t, h] (the f32 product). The result is attention() over those f32 keys and values
// (q f32, bf16 or f16; out q's dtype), to the contract's tolerance for q's dtype: the decode kernel
// multiplies the scores by the key scales and P by the value scales instead of scaling each element
// (docs/semantics.md, "Quantized KV caches"). The scales of every key read must be finite and > 0.
#pragma once
#include "attn/attention.h"

namespace attn {

struct PagedKV {
  Tensor k_pages;      // [num_blocks, block_size, Hkv, D]
  Tensor v_pages;      // [num_blocks, block_size, Hkv, Dv], k_pages' dtype
  Tensor block_table;  // int32 [B, max_blocks]; entries past a sequence's keys are not read
  Tensor seqused_k;    // int32 [B], each <= max_blocks * block_size
  // int8 pools only: f32 [num_blocks, block_size, Hkv] each (undefined for floating pools).
  Tensor k_scales, v_scales;
};

// cu_seqlens_q: int32 [B + 1] (0, non-decreasing, last = total_q), or undefined for one query per
// sequence (q [B, Hq, D]).
AttentionResult attention_paged(const Tensor& q, const Tensor& cu_seqlens_q, const PagedKV& kv,
                                const AttentionOptions& options = {});

}  // namespace attn
