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
#pragma once
#include "attn/attention.h"

namespace attn {

struct PagedKV {
  Tensor k_pages;      // [num_blocks, block_size, Hkv, D]
  Tensor v_pages;      // [num_blocks, block_size, Hkv, Dv], k_pages' dtype
  Tensor block_table;  // int32 [B, max_blocks]; entries past a sequence's keys are not read
  Tensor seqused_k;    // int32 [B], each <= max_blocks * block_size
};

// cu_seqlens_q: int32 [B + 1] (0, non-decreasing, last = total_q), or undefined for one query per
// sequence (q [B, Hq, D]).
AttentionResult attention_paged(const Tensor& q, const Tensor& cu_seqlens_q, const PagedKV& kv,
                                const AttentionOptions& options = {});

}  // namespace attn
