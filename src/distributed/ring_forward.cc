// Ring attention over MPI, the forward (include/attn/ring.h; shapes in ring_setup.h).
//
// Step t = 0 .. P-1: rank r holds block s = r - t (mod P). It posts the receive of block s - 1 from
// its left neighbour and the send of block s to its right one, computes attention of its queries
// against block s (only the rectangles the position rule connects, see ring_plan.h), merges the
// partial (out, lse) into its running result exactly:
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b,
// then waits for both transfers.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "distributed/ring_setup.h"

namespace attn {

namespace {

using distributed::Buffer;
using distributed::Clock;
using distributed::kNegInf;
using distributed::Piece;
using distributed::Plan;
using distributed::PrivateComm;
using distributed::Setup;

// Merges one block's (out [BH, n, Dv], lse [BH, n]) into the running result of rows [row0, row0 +
// n).
void merge_rows(double* acc_out, double* acc_lse, int64_t rows_total, int64_t row0,
                const Tensor& out, const Tensor& lse, int64_t BH, int64_t n, int64_t Dv) {
  const Tensor oc = out.contiguous(), lc = lse.contiguous();
  distributed::with_reader(oc, [&](auto o) {
    distributed::with_reader(lc, [&](auto l) {
      for (int64_t bh = 0; bh < BH; ++bh) {
        for (int64_t i = 0; i < n; ++i) {
          const double lb = l(bh * n + i);
          if (lb == kNegInf) continue;  // no allowed key of this block for this row
          double& la = acc_lse[bh * rows_total + row0 + i];
          double* a = acc_out + (bh * rows_total + row0 + i) * Dv;
          const int64_t src = (bh * n + i) * Dv;
          if (la == kNegInf) {  // first block with a key for this row: nothing to rescale (no -inf
                                // - -inf)
            for (int64_t d = 0; d < Dv; ++d) a[d] = o(src + d);
            la = lb;
            continue;
          }
          const double m = std::max(la, lb);
          const double wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
          for (int64_t d = 0; d < Dv; ++d) a[d] = (a[d] * wa + o(src + d) * wb) / sum;
          la = m + std::log(sum);
        }
      }
    });
  });
}

}  // namespace

AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const AttentionOptions& o, MPI_Comm comm, RingLayout layout) {
  constexpr const char* fn = "attn::ring_attention";
  distributed::check_communicator(fn, comm);
  PrivateComm pc(comm);
  const int fail_step = distributed::take_fail_step();
  const Clock::time_point t_start = Clock::now();
  RingStats stats;
  const Setup st = distributed::collective_setup(fn, pc, q, k, v, o, layout);
  const Plan& plan = st.plan;
  const int r = pc.rank(), P = pc.size();
  const int64_t Lr = plan.q_len[r];

  // Buffers; an allocation failure on any rank stops every rank before the first send.
  Buffer buf[2];
  std::vector<double> acc_out, acc_lse;
  std::string error;
  try {
    size_t max_bytes = 0;
    for (int s = 0; s < P; ++s) max_bytes = std::max(max_bytes, block_bytes(st, s, st.dtype));
    buf[0].reserve(max_bytes);
    buf[1].reserve(max_bytes);
    acc_out.assign(static_cast<size_t>(st.BH * Lr * st.Dv), 0.0);
    acc_lse.assign(static_cast<size_t>(st.BH * Lr), kNegInf);
    auto [k0, v0] = block_views(st, buf[0], r, st.dtype);
    k0.copy_from(k);
    v0.copy_from(v);
  } catch (const std::exception& e) {
    error = fmt::format("{}: {}", fn, e.what());
  }
  if (const std::string agreed = distributed::agree_on_error(pc.get(), fn, error);
      !agreed.empty()) {
    distributed::throw_collective(agreed);
  }

  const Tensor qc = distributed::in_compute(q);
  int cur = 0;
  for (int t = 0; t < P; ++t) {
    const int s = (r - t + P) % P, s_next = (r - t - 1 + 2 * P) % P;
    std::vector<MPI_Request> reqs;
    const bool holding =
        distributed::pass_blocks(pc, st, t, s, s_next, buf[cur], buf[1 - cur], &reqs, &stats);
    // A rank that failed keeps passing blocks on (so nobody waits forever) but computes nothing
    // more.
    if (t == fail_step && error.empty()) error = distributed::injected_failure(fn, t);
    const Clock::time_point t_compute = Clock::now();
    if (holding && plan.need(r, s) && error.empty()) {
      ++stats.blocks_computed;
      try {
        auto [kb, vb] = block_views(st, buf[cur], s, st.dtype);
        for (const Piece& piece : distributed::pieces_of(plan, r, s)) {
          const int64_t n = piece.i1 - piece.i0, m = piece.j1 - piece.j0;
          const AttentionResult res =
              attention(qc.slice(-2, piece.q_local, piece.q_local + n),
                        distributed::in_compute(kb.slice(-2, piece.k_offset, piece.k_offset + m)),
                        distributed::in_compute(vb.slice(-2, piece.k_offset, piece.k_offset + m)),
                        distributed::piece_options(o, st, piece));
          merge_rows(acc_out.data(), acc_lse.data(), Lr, piece.q_local, res.out, res.lse, st.BH, n,
                     st.Dv);
          distributed::poke(&reqs);
        }
      } catch (const std::exception& e) {
        error = fmt::format("{}: {}", fn, e.what());
      }
    }
    const Clock::time_point t_wait = Clock::now();
    stats.compute_ms += std::chrono::duration<double, std::milli>(t_wait - t_compute).count();
    distributed::wait_all(&reqs);
    stats.wait_ms += distributed::ms_since(t_wait);
    cur = 1 - cur;
  }
  stats.steps = P;
  if (const std::string agreed = distributed::agree_on_error(pc.get(), fn, error);
      !agreed.empty()) {
    distributed::throw_collective(agreed);
  }

  AttentionResult res;
  res.out = distributed::to_tensor(acc_out.data(),
                                   distributed::with_length(st.batch, st.Hq, Lr, st.Dv), st.dtype);
  Shape lse_shape = st.batch;
  lse_shape.insert(lse_shape.end(), {st.Hq, Lr});
  res.lse = distributed::to_tensor(acc_lse.data(), lse_shape, distributed::acc_dtype(st.dtype));
  stats.total_ms = distributed::ms_since(t_start);
  distributed::record_stats(stats);
  return res;
}

}  // namespace attn
