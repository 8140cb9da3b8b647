// The pieces ring_forward.cc and ring_backward.cc share (ring_setup.h).
#include "distributed/ring_setup.h"

#include <algorithm>
#include <atomic>

namespace attn {

namespace {
thread_local RingStats g_last_stats;
std::atomic<int> g_fail_step{-1};
}  // namespace

RingStats ring_last_stats() {
  return g_last_stats;
}

namespace testing {
void ring_fail_at_step(int step) {
  g_fail_step.store(step);
}
}  // namespace testing

namespace distributed {

void record_stats(const RingStats& stats) {
  g_last_stats = stats;
}

int take_fail_step() {
  return g_fail_step.exchange(-1);
}

Shape with_length(const Shape& batch, int64_t heads, int64_t length, int64_t dim) {
  Shape s = batch;
  s.insert(s.end(), {heads, length, dim});
  return s;
}

std::pair<Tensor, Tensor> block_views(const Setup& st, const Buffer& buf, int s, DType dtype) {
  const int64_t L = st.plan.k_len[s];
  const size_t k_bytes = static_cast<size_t>(st.BHkv * L * st.D) * dtype_size(dtype);
  Tensor kt = Tensor::from_blob(buf.data(), with_length(st.batch, st.Hkv, L, st.D), dtype);
  Tensor vt =
      Tensor::from_blob(buf.data() + k_bytes, with_length(st.batch, st.Hkv, L, st.Dv), dtype);
  return {kt, vt};
}

size_t block_bytes(const Setup& st, int s, DType dtype) {
  return static_cast<size_t>(st.BHkv * st.plan.k_len[s] * (st.D + st.Dv)) * dtype_size(dtype);
}

bool pass_blocks(const PrivateComm& pc, const Setup& st, int t, int s, int s_next,
                 const Buffer& cur, const Buffer& next, std::vector<MPI_Request>* reqs,
                 RingStats* stats) {
  const Plan& plan = st.plan;
  if (t + 1 <= plan.hops[s_next]) {
    irecv_bytes(next.data(), block_bytes(st, s_next, st.dtype), pc.left(), kTagKV, pc.get(), reqs);
  }
  const bool holding = t <= plan.hops[s];
  if (holding && t + 1 <= plan.hops[s]) {
    isend_bytes(cur.data(), block_bytes(st, s, st.dtype), pc.right(), kTagKV, pc.get(), reqs);
    stats->bytes_sent += static_cast<int64_t>(block_bytes(st, s, st.dtype));
  }
  return holding;
}

std::vector<Piece> pieces_of(const Plan& plan, int r, int s) {
  std::vector<Piece> out;
  for (const RingSegment& qs : plan.q_segs[r]) {
    for (const RingSegment& ks : plan.k_segs[s]) {
      const Box box =
          connect(plan.bounds, qs.start, qs.start + qs.length, ks.start, ks.start + ks.length);
      if (box.empty()) continue;
      const int64_t rows = box.i1 - box.i0;
      // Cut only long row ranges: every call packs the block's K/V again, so 256-row pieces of a
      // 1024-row block cost 20% here; 2048 rows and more amortise it.
      const int64_t n_parts = std::clamp<int64_t>(rows / 2048, 1, 4);
      for (int64_t p = 0; p < n_parts; ++p) {
        const int64_t a = box.i0 + rows * p / n_parts, b = box.i0 + rows * (p + 1) / n_parts;
        if (a >= b) continue;
        // Rows [a, b) meet keys in [j0', j1') within the box: shrink the key range to them.
        const Box sub = connect(plan.bounds, a, b, box.j0, box.j1);
        if (sub.empty()) continue;
        out.push_back({sub.i0, sub.i1, sub.j0, sub.j1, qs.local + (sub.i0 - qs.start),
                       ks.local + (sub.j0 - ks.start)});
      }
    }
  }
  return out;
}

AttentionOptions piece_options(const AttentionOptions& o, const Setup& st, const Piece& pc) {
  AttentionOptions po = o;
  po.position_offset = st.plan.bounds.offset + pc.i0 - pc.j0;
  if (!st.key_lengths.empty()) {
    std::vector<double> kl(st.key_lengths.size());
    for (size_t b = 0; b < kl.size(); ++b) {
      kl[b] = static_cast<double>(std::clamp<int64_t>(st.key_lengths[b] - pc.j0, 0, pc.j1 - pc.j0));
    }
    po.key_lengths = Tensor::from_vector({static_cast<int64_t>(kl.size())}, kl, DType::i64);
  }
  return po;
}

Tensor in_compute(const Tensor& t) {
  return t.dtype() == acc_dtype(t.dtype()) ? t : t.to(acc_dtype(t.dtype()));
}

void throw_collective(const std::string& agreed) {
  throw Error(fmt::format("{} (every rank stopped)", agreed));
}

std::string injected_failure(const char* fn, int t) {
  return fmt::format("{}: injected failure at ring step {} (attn::testing::ring_fail_at_step)", fn,
                     t);
}

}  // namespace distributed
}  // namespace attn
