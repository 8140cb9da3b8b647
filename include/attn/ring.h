// Ring attention: exact attention over a sequence split across the ranks of an MPI communicator
// (sequence / context parallelism). Available when attn is built with -DATTN_WITH_MPI=ON (the attn
// target then defines ATTN_WITH_MPI and links MPI); docs/DISTRIBUTED.md explains the model and its
// costs.
//
// Every rank r of `comm` holds its slice of the sequence dim (dim -2) of q, k and v:
//   q_local [..., Hq, Lq_r, D], k_local [..., Hkv, Lk_r, D], v_local [..., Hkv, Lk_r, Dv]
//   -> out_local [..., Hq, Lq_r, Dv], lse_local [..., Hq, Lq_r]
// and gets the rows of attn::attention(q, k, v, options) that its queries own, where q, k, v are
// the global tensors (the slices put together in rank order, as RingLayout says). Positions,
// causal, windows, ALiBi and key_lengths are those of the global sequence: key_lengths holds global
// lengths and must be the same on every rank, as must every other option except `backend` and
// `threads`.
//
// K/V blocks travel around the ring (rank r sends to r + 1) with non-blocking sends and receives
// that overlap the computation of the block in hand; partial outputs merge exactly through their
// LSE. A block that the position rule (causal, window, key lengths) removes for every query of a
// rank is not computed there, and is not sent past the last rank that needs it.
//
// Supported: scale, softcap, causal (either alignment), position_offset, window, key_lengths,
// alibi_slopes, GQA/MQA, any batch dims, any floating dtype (bf16 / f16 blocks travel as they are
// and are computed in f32, so that only the final result is rounded). Refused with attn::Error:
// dense masks, block layouts, dropout, return_weights and mask_grad (functions of global (i, j)
// that a rank cannot see whole).
//
// Errors are collective: bad input on any rank (shapes, options that differ between ranks, lengths
// that do not fit the layout) is detected before any block is sent, and a failure while computing
// is reported after the ring completes, so that every rank throws the same attn::Error, naming the
// rank that failed, and no rank waits forever. Every rank of `comm` must make the same calls in the
// same order (they are collective).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.h"

namespace attn {

// How the global sequence is split across P ranks.
//   contiguous: rank r holds one contiguous slice; slices may have any lengths (also 0), in rank
//   order. zigzag:     the sequence is cut into 2P chunks, chunk c = [floor(c L / 2P), floor((c +
//   1) L / 2P)), and
//               rank r holds chunks r and 2P - 1 - r, in that order. Under a causal mask every rank
//               then does about the same work (early and late queries pair up).
// The layout applies to q and to k/v separately (each by its own global length).
enum class RingLayout : uint8_t { contiguous, zigzag };

RingLayout parse_ring_layout(const std::string& name);  // "contiguous", "zigzag"
const char* ring_layout_name(RingLayout layout);

// A piece of the global sequence a rank holds: global positions [start, start + length), stored at
// local offset `local`.
struct RingSegment {
  int64_t start = 0;
  int64_t length = 0;
  int64_t local = 0;
};

// The segments rank `rank` of `world` holds of a global length `length` (contiguous: the balanced
// split [floor(r L / P), floor((r + 1) L / P))).
std::vector<RingSegment> ring_segments(int64_t length, int rank, int world, RingLayout layout);

// A contiguous copy of the part of `full` (sequence dim `dim`) that ring_segments gives rank
// `rank`.
Tensor ring_shard(const Tensor& full, int rank, int world, RingLayout layout, int dim = -2);

// The inverse, collective over `comm`: puts every rank's `local` (sequence dim `dim`, in `layout`)
// back into the global tensor, returned on every rank. The other dims must agree across ranks.
Tensor ring_gather(const Tensor& local, RingLayout layout, MPI_Comm comm, int dim = -2);

// Forward. Collective over `comm`.
AttentionResult ring_attention(const Tensor& q_local, const Tensor& k_local, const Tensor& v_local,
                               const AttentionOptions& options, MPI_Comm comm,
                               RingLayout layout = RingLayout::contiguous);

// Backward of ring_attention given dout_local = dL/dout_local and that call's out_local and
// lse_local. dq stays on its rank; dk and dv are accumulated as their K/V blocks travel and come
// home to the rank that holds k_local and v_local. Collective over `comm`.
AttentionGrads ring_attention_backward(const Tensor& dout_local, const Tensor& q_local,
                                       const Tensor& k_local, const Tensor& v_local,
                                       const Tensor& out_local, const Tensor& lse_local,
                                       const AttentionOptions& options, MPI_Comm comm,
                                       RingLayout layout = RingLayout::contiguous);

// Where the last ring_attention / ring_attention_backward of this thread spent its time, on this
// rank (for `attn ring --bench` and docs/DISTRIBUTED.md).
struct RingStats {
  int steps = 0;  // ring steps (= ranks)
  int blocks_computed =
      0;                   // blocks this rank computed (the others were masked out or only relayed)
  int64_t bytes_sent = 0;  // K/V blocks sent; in the backward also the dK/dV sums
  double compute_ms = 0;   // attention on the blocks in hand, transfers in flight meanwhile
  double wait_ms = 0;      // waiting for transfers after computing: communication not hidden
  double total_ms = 0;     // the whole call, validation and the error agreement included
};
RingStats ring_last_stats();

namespace testing {
// Fault injection for the tests: the next ring_attention / ring_attention_backward on this process
// fails at ring step `step` (after the collective validation, with blocks in flight), as a rank
// whose computation throws would. -1 (the default) disables it; it resets itself after one use.
void ring_fail_at_step(int step);
}  // namespace testing

}  // namespace attn
