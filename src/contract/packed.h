// What the packed entries share (attn/varlen.h, attn/paged.h): the offsets' checks, the options that
// take another form in a packed batch, one problem per sequence over strided views of the packed rows,
// and the loop that runs the sequences. Messages start with the entry's name `fn`.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attn/attention.h"
#include "contract/problem.h"
#include "core/parallel.h"

namespace attn::contract {

// The validated call: offsets, and one problem per sequence (outputs not yet set).
struct Packed {
  int64_t B = 0, total_q = 0, total_k = 0;
  std::vector<int64_t> cu_q, cu_k;
  std::vector<ForwardProblem> seqs;
  Backend backend = Backend::reference;
  bool drops_all = false;  // dropout_p == 1 (contract::Validated::drops_all)
  int threads = 0;
};

// Options that take another form in a packed batch, refused by name.
void refuse_unpacked_options(const char* fn, const AttentionOptions& o);

// The heads, head dims and dtype every sequence of a packed call shares.
struct SequenceShapes {
  int64_t Hq = 0, Hkv = 0, D = 0, Dv = 0;
  DType dtype = DType::f32;
};

// pk.seqs from pk.cu_q and pk.cu_k (Lq_b, Lk_b): one problem of B = 1 per sequence with every
// option resolved (scalars, sinks, dropout as batch entry b, the position rule against Lq_b and
// Lk_b, the ALiBi row of b, used[b] keys when `used` is not empty), and pk.backend, pk.drops_all and
// pk.threads. Their tensors are the caller's to set.
void build_sequences(const char* fn, const AttentionOptions& o, const SequenceShapes& shapes,
                     const std::vector<int64_t>& used, Packed& pk);

// cu_seqlens_x: int32 [B + 1], starting at 0, non-decreasing, ending at the packed length `total`
// of `tensor` (named for the message).
std::vector<int64_t> read_offsets(const char* fn, const char* name, const Tensor& cu, int64_t total,
                                  const char* tensor, const Tensor& t);

// max_seqlen_x: -1 (not given) or a bound no sequence exceeds.
void check_max_seqlen(const char* fn, const char* name, int64_t bound,
                      const std::vector<int64_t>& cu);

// ALiBi slopes [Hq] or [B, Hq], finite: the row of each sequence.
std::vector<std::vector<double>> read_alibi(const char* fn, const AttentionOptions& o, int64_t B,
                                            int64_t Hq);

// t itself when its last dim is unit-stride (or of one element), else a contiguous copy: the
// kernels read a row's X elements as one run (sequence_view keeps the last dim's stride).
inline Tensor unit_stride_rows(const Tensor& t) {
  return t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1 ? t.contiguous() : t;
}

// Rows [r0, r1) of a packed [total, H, X] tensor (last dim unit-stride: unit_stride_rows) as the 4-D
// view [1, H, r1 - r0, X].
inline Tensor sequence_view(const Tensor& t, int64_t r0, int64_t r1) {
  return t.slice(0, r0, r1).permute({1, 0, 2}).unsqueeze(0);
}

// Columns [c0, c1) of lse [H, total] as the 3-D view [1, H, c1 - c0].
inline Tensor lse_view(const Tensor& lse, int64_t c0, int64_t c1) {
  return lse.slice(1, c0, c1).unsqueeze(0);
}

// A sequence of at least this many multiply-adds per thread runs alone on every thread: its own
// tasks then balance the threads, and one team wake-up (~50 us under a passive wait policy) is small
// beside ~60 us of work per core (2^24 at ~275 GFLOP/s).
inline constexpr double kAloneWorkPerThread = double(1 << 24);

// Runs fn(b, threads) for every sequence with rows: a large one (kAloneWorkPerThread per thread, or
// more than 1 / threads of the call's work) alone with every thread, one after another; the others
// at one thread each, longest first, in one parallel loop that hands them out as threads free up.
// (With a pool of one thread per sequence only, a sequence of 43% of the work held one thread while
// the other finished the rest: the packed forward of the varlen benchmark ran 9-13% behind separate
// calls.)
template <class Fn>
void for_each_sequence(const Packed& pk, Fn&& fn) {
  const int threads = resolve_threads(pk.threads);
  std::vector<double> work(static_cast<size_t>(pk.B));
  double total = 0.0;
  for (int64_t b = 0; b < pk.B; ++b) {
    const ForwardProblem& p = pk.seqs[b];
    work[b] = static_cast<double>(p.Hq) * static_cast<double>(p.Lq) *
              static_cast<double>(std::max<int64_t>(p.key_length_of(0), 1)) *
              static_cast<double>(p.D + p.Dv);
    total += work[b];
  }
  std::vector<int64_t> alone, shared;
  for (int64_t b = 0; b < pk.B; ++b) {
    if (pk.seqs[b].Lq == 0) continue;
    const bool large = work[b] >= kAloneWorkPerThread * threads || work[b] * threads > total;
    (threads > 1 && large ? alone : shared).push_back(b);
  }
  for (int64_t b : alone) fn(b, threads);
  std::stable_sort(shared.begin(), shared.end(),
                   [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  parallel_for(static_cast<int64_t>(shared.size()), threads,
               [&](int64_t task, int) { fn(shared[task], 1); });
}

}  // namespace attn::contract
