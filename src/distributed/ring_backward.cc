// Ring attention over MPI, the backward (include/attn/ring.h; shapes in ring_setup.h).
//
// With the global out and lse of a row, attention_backward on one block gives exactly that block's
// terms of dq (its sum over the block's keys) and of dk, dv (their sums over this rank's queries),
// because P_ij = exp(s_ij - lse_i) and D_i = dO_i . O_i are global quantities. dq sums locally.
// dK/dV accumulators (f32, f64 for f64 inputs) travel one step behind their K/V block: at step t a
// rank computes its terms for block s into `part`, then adds the accumulator that arrives from the
// left and sends the sum right (overlapping the next step's compute); after the last rank that
// needs block s, the sum goes home to s.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "distributed/ring_setup.h"

namespace attn {

namespace {

using distributed::Buffer;
using distributed::Clock;
using distributed::Piece;
using distributed::Plan;
using distributed::PrivateComm;
using distributed::Setup;

// acc[bh, row0 + i, :] += src[bh, i, :] for a contiguous src [BH, n, W]; acc has rows_total rows
// per bh.
template <class A>
void add_rows(A* acc, int64_t rows_total, int64_t row0, const Tensor& src, int64_t BH, int64_t n,
              int64_t W) {
  const Tensor sc = src.contiguous();
  distributed::with_reader(sc, [&](auto s) {
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t i = 0; i < n; ++i) {
        A* a = acc + (bh * rows_total + row0 + i) * W;
        const int64_t e = (bh * n + i) * W;
        for (int64_t d = 0; d < W; ++d) a[d] += static_cast<A>(s(e + d));
      }
    }
  });
}

// The inputs of one backward call, in the compute dtype (lse as given).
struct Inputs {
  Tensor dout, q, out, lse;
};

// The backward's state on one rank, with the accumulators' element type A (float, or double for
// f64 inputs). run() walks the ring: at each step the K/V block moves on, this rank adds its terms
// of the block it holds, and the block's dK/dV accumulator follows one step behind.
template <class A>
class RingBackward {
 public:
  RingBackward(const char* fn, const PrivateComm& pc, const Setup& st, RingStats* stats)
      : fn_(fn),
        pc_(pc),
        st_(st),
        plan_(st.plan),
        r_(pc.rank()),
        P_(pc.size()),
        Lr_(plan_.q_len[r_]),
        stats_(stats) {}

  AttentionGrads run(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& out, const Tensor& lse, const AttentionOptions& o,
                     int fail_step) {
    allocate(k, v);
    // My block's accumulators come home from the last rank that used it.
    if (plan_.hops[r_] > 0) {
      distributed::irecv_bytes(home_.data(), acc_bytes(r_), (r_ + plan_.hops[r_]) % P_,
                               distributed::kTagHome, pc_.get(), &home_req_);
    }
    const Inputs in{distributed::in_compute(dout), distributed::in_compute(q),
                    distributed::in_compute(out), lse};
    for (int t = 0, cur = 0; t < P_; ++t, cur = 1 - cur) step(t, cur, in, o, fail_step);
    const Clock::time_point t_wait = Clock::now();
    distributed::wait_all(&dkv_sent_);
    distributed::wait_all(&home_req_);
    stats_->wait_ms += distributed::ms_since(t_wait);
    stats_->steps = P_;
    agree();

    AttentionGrads g;
    g.dq = distributed::to_tensor(dq_.data(), q.shape(), st_.dtype);
    const A* h = reinterpret_cast<const A*>(home_.data());
    g.dk = distributed::to_tensor(h, k.shape(), st_.dtype);
    g.dv = distributed::to_tensor(h + st_.BHkv * plan_.k_len[r_] * st_.D, v.shape(), st_.dtype);
    return g;
  }

 private:
  // dK/dV accumulators of block s: [BHkv, Lk_s, D] then [BHkv, Lk_s, Dv], element type A.
  int64_t acc_elems(int s) const { return st_.BHkv * plan_.k_len[s] * (st_.D + st_.Dv); }
  size_t acc_bytes(int s) const { return static_cast<size_t>(acc_elems(s)) * sizeof(A); }

  // Every rank stops together when one has failed.
  void agree() const {
    if (const std::string agreed = distributed::agree_on_error(pc_.get(), fn_, error_);
        !agreed.empty()) {
      distributed::throw_collective(agreed);
    }
  }

  // Buffers; an allocation failure on any rank stops every rank before the first send.
  void allocate(const Tensor& k, const Tensor& v) {
    try {
      size_t max_kv = 0, max_acc = 0;
      for (int s = 0; s < P_; ++s) {
        max_kv = std::max(max_kv, block_bytes(st_, s, st_.dtype));
        max_acc = std::max(max_acc, acc_bytes(s));
      }
      for (Buffer* b : {&kv_[0], &kv_[1]}) b->reserve(max_kv);
      for (Buffer* b : {&dkv_out_[0], &dkv_out_[1], &dkv_in_}) b->reserve(max_acc);
      home_.reserve(acc_bytes(r_));
      part_.resize(max_acc / sizeof(A));
      dq_.assign(static_cast<size_t>(st_.BH * Lr_ * st_.D), 0.0);
      auto [k0, v0] = block_views(st_, kv_[0], r_, st_.dtype);
      k0.copy_from(k);
      v0.copy_from(v);
    } catch (const std::exception& e) {
      error_ = fmt::format("{}: {}", fn_, e.what());
    }
    agree();
  }

  // Step t: block s is in kv_[cur].
  void step(int t, int cur, const Inputs& in, const AttentionOptions& o, int fail_step) {
    const int s = (r_ - t + P_) % P_, s_next = (r_ - t - 1 + 2 * P_) % P_;
    std::vector<MPI_Request> reqs, dkv_recv;
    const bool holding =
        distributed::pass_blocks(pc_, st_, t, s, s_next, kv_[cur], kv_[1 - cur], &reqs, stats_);
    // The accumulator of block s, from the rank that used it one step ago.
    const bool acc_arrives = holding && t >= 1;
    if (acc_arrives) {
      distributed::irecv_bytes(dkv_in_.data(), acc_bytes(s), pc_.left(), distributed::kTagDKV,
                               pc_.get(), &dkv_recv);
    }
    // A rank that failed keeps passing blocks on (so nobody waits forever) but computes nothing
    // more.
    if (t == fail_step && error_.empty()) error_ = distributed::injected_failure(fn_, t);
    const Clock::time_point t_compute = Clock::now();
    bool touched = false;
    if (holding && plan_.need(r_, s) && error_.empty()) {
      ++stats_->blocks_computed;
      try {
        add_block_terms(s, kv_[cur], in, o, &reqs);
        touched = true;
      } catch (const std::exception& e) {
        error_ = fmt::format("{}: {}", fn_, e.what());
      }
    }
    Clock::time_point t_wait = Clock::now();
    stats_->compute_ms += std::chrono::duration<double, std::milli>(t_wait - t_compute).count();
    if (holding) pass_accumulator(t, s, acc_arrives, touched, &dkv_recv);
    t_wait = Clock::now();
    distributed::wait_all(&reqs);
    stats_->wait_ms += distributed::ms_since(t_wait);
  }

  // This rank's terms of block s: dq into dq_, dK/dV into part_.
  void add_block_terms(int s, const Buffer& kv, const Inputs& in, const AttentionOptions& o,
                       std::vector<MPI_Request>* reqs) {
    std::fill(part_.begin(), part_.begin() + acc_elems(s), A(0));
    A* part_k = part_.data();
    A* part_v = part_.data() + st_.BHkv * plan_.k_len[s] * st_.D;
    auto [kb, vb] = block_views(st_, kv, s, st_.dtype);
    for (const Piece& piece : distributed::pieces_of(plan_, r_, s)) {
      const int64_t n = piece.i1 - piece.i0, m = piece.j1 - piece.j0;
      const int64_t a = piece.q_local, c = piece.k_offset;
      const AttentionGrads g = attention_backward(
          in.dout.slice(-2, a, a + n), in.q.slice(-2, a, a + n),
          distributed::in_compute(kb.slice(-2, c, c + m)),
          distributed::in_compute(vb.slice(-2, c, c + m)), in.out.slice(-2, a, a + n),
          in.lse.slice(-1, a, a + n), distributed::piece_options(o, st_, piece));
      add_rows(dq_.data(), Lr_, a, g.dq, st_.BH, n, st_.D);
      add_rows(part_k, plan_.k_len[s], c, g.dk, st_.BHkv, m, st_.D);
      add_rows(part_v, plan_.k_len[s], c, g.dv, st_.BHkv, m, st_.Dv);
      distributed::poke(reqs);
      distributed::poke(&dkv_sent_);
    }
  }

  // acc(s) = what arrived + my part, into the out buffer not in flight; then on to the right, or
  // home to s after the last rank that needs it.
  void pass_accumulator(int t, int s, bool acc_arrives, bool touched,
                        std::vector<MPI_Request>* dkv_recv) {
    const Clock::time_point t_wait = Clock::now();
    distributed::wait_all(dkv_recv);
    distributed::wait_all(&dkv_sent_);
    stats_->wait_ms += distributed::ms_since(t_wait);
    Buffer& ob = dkv_out_[t % 2];
    A* acc = reinterpret_cast<A*>(ob.data());
    const int64_t ne = acc_elems(s);
    const size_t bytes = acc_bytes(s);
    if (acc_arrives) {
      std::memcpy(acc, dkv_in_.data(), bytes);
    } else {
      std::fill(acc, acc + ne, A(0));
    }
    if (touched) {
      for (int64_t e = 0; e < ne; ++e) acc[e] += part_[e];
    }
    if (s != r_ || t + 1 <= plan_.hops[s]) stats_->bytes_sent += static_cast<int64_t>(bytes);
    if (t + 1 <= plan_.hops[s]) {
      distributed::isend_bytes(acc, bytes, pc_.right(), distributed::kTagDKV, pc_.get(),
                               &dkv_sent_);
    } else if (s != r_) {
      distributed::isend_bytes(acc, bytes, s, distributed::kTagHome, pc_.get(), &dkv_sent_);
    } else {
      std::memcpy(home_.data(), acc, bytes);  // my block went nowhere: its sum is complete
    }
  }

  const char* fn_;
  const PrivateComm& pc_;
  const Setup& st_;
  const Plan& plan_;
  const int r_, P_;
  const int64_t Lr_;
  RingStats* stats_;

  Buffer kv_[2], dkv_out_[2], dkv_in_, home_;
  std::vector<A> part_;
  std::vector<double> dq_;
  std::string error_;
  std::vector<MPI_Request> home_req_;
  std::vector<MPI_Request>
      dkv_sent_;  // the accumulator sent at the previous step (overlaps this step)
};

}  // namespace

AttentionGrads ring_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       const AttentionOptions& o, MPI_Comm comm,
                                       RingLayout layout) {
  constexpr const char* fn = "attn::ring_attention_backward";
  distributed::check_communicator(fn, comm);
  PrivateComm pc(comm);
  const int fail_step = distributed::take_fail_step();
  const Clock::time_point t_start = Clock::now();
  RingStats stats;
  const Setup st = distributed::collective_setup(fn, pc, q, k, v, o, layout, &dout, &out, &lse);
  AttentionGrads g =
      st.dtype == DType::f64
          ? RingBackward<double>(fn, pc, st, &stats).run(dout, q, k, v, out, lse, o, fail_step)
          : RingBackward<float>(fn, pc, st, &stats).run(dout, q, k, v, out, lse, o, fail_step);
  stats.total_ms = distributed::ms_since(t_start);
  distributed::record_stats(stats);
  return g;
}

}  // namespace attn
