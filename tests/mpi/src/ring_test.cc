// Ring attention under mpirun (-np 2, 3, 4): every rank's output, LSE and gradients equal the rows
// of the single-process attention on the gathered tensors (f32: <= 1e-6 relative to the tensor's
// largest magnitude; f64: <= 1e-12), on every conformance case of tests/cases/attention_cases.txt
// that the ring runs (full, causal in both alignments, windowed and padded attention, GQA, ALiBi,
// softcap, scale, lengths that do not divide by the number of ranks) in both layouts, and on
// position offsets, padded batch entries and uneven slices; the cases with an option the ring
// refuses (dense masks, block layouts, dropout) make every rank throw an error naming it, as do bad
// input and a failure on one rank, instead of hanging.
//
// Every test is collective: all ranks run it, errors are reduced over ranks before the assertions,
// so all ranks pass or fail together.
#include "attn/ring.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "cases/conformance_cases.h"
#include "distributed/ring_plan.h"

namespace attn {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

double max_over_ranks(double x) {
  if (std::isnan(x)) x = std::numeric_limits<double>::infinity();
  double y = 0;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return y;
}

// The same pseudo-random tensor on every rank.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1.0,
                     double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(checked_numel(shape, "random_tensor")));
  for (double& x : v) x = dist(gen);
  return Tensor::from_vector(shape, v, dtype);
}

// max |a - b| / max |b|; equal infinities (lse = -inf on fully masked rows) match, anything else
// non-finite is an infinite error.
double rel_err(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    if (std::isinf(y[e]) || std::isinf(x[e])) {
      if (x[e] != y[e]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(x[e]) || std::isnan(y[e])) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::abs(x[e] - y[e]));
    den = std::max(den, std::abs(y[e]));
  }
  return den > 0 ? num / den : num;
}

// The part of `full` (sequence dim `dim`) a rank holds: the given segments, concatenated.
Tensor take(const Tensor& full, const std::vector<RingSegment>& segs, int dim) {
  const int d = dim < 0 ? dim + full.dim() : dim;
  Shape shape = full.shape();
  shape[d] = 0;
  for (const RingSegment& s : segs) shape[d] += s.length;
  Tensor out = Tensor::empty(shape, full.dtype());
  for (const RingSegment& s : segs) {
    if (s.length > 0)
      out.slice(d, s.local, s.local + s.length)
          .copy_from(full.slice(d, s.start, s.start + s.length));
  }
  return out;
}

// Contiguous segments with explicit per-rank lengths (summing to the global length).
std::vector<RingSegment> contiguous_segments(const std::vector<int64_t>& lengths, int rank) {
  int64_t start = 0;
  for (int r = 0; r < rank; ++r) start += lengths[r];
  return {{start, lengths[rank], 0}};
}

struct Case {
  std::string name;
  Shape batch{2};
  int64_t Hq = 4, Hkv = 2, Lq = 37, Lk = 37, D = 16, Dv = 12;
  DType dtype = DType::f32;
  AttentionOptions options;
  RingLayout layout = RingLayout::contiguous;
  // Contiguous layout only: per-rank lengths as fractions are awkward, so a rule: "uneven" gives
  // rank r a share proportional to r + 1 and the last rank nothing (when P > 2).
  bool uneven = false;
};

std::vector<int64_t> uneven_lengths(int64_t L, int P) {
  std::vector<int64_t> len(P, 0);
  const int parts = P > 2 ? P - 1 : P;  // the last rank holds nothing when P > 2
  const int64_t weight_sum = int64_t{parts} * (parts + 1) / 2;
  int64_t given = 0;
  for (int r = 0; r < parts; ++r) {
    len[r] = L * (r + 1) / weight_sum;
    given += len[r];
  }
  len[0] += L - given;
  return len;
}

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

// A rank's rows of the forward and backward: its own (ring) or taken from one process's results.
struct Rows {
  Tensor out, lse, dq, dk, dv;
};

Rows take_rows(const AttentionResult& f, const AttentionGrads& g,
               const std::vector<RingSegment>& q_seg, const std::vector<RingSegment>& k_seg) {
  return {take(f.out, q_seg, -2), take(f.lse, q_seg, -1), take(g.dq, q_seg, -2),
          take(g.dk, k_seg, -2), take(g.dv, k_seg, -2)};
}

// The largest errors of got against want over all ranks.
Errors errors(const Rows& got, const Rows& want) {
  Errors e;
  e.out = max_over_ranks(rel_err(got.out, want.out));
  e.lse = max_over_ranks(rel_err(got.lse, want.lse));
  e.dq = max_over_ranks(rel_err(got.dq, want.dq));
  e.dk = max_over_ranks(rel_err(got.dk, want.dk));
  e.dv = max_over_ranks(rel_err(got.dv, want.dv));
  return e;
}

struct RingRun {
  std::vector<RingSegment> q_seg, k_seg;  // this rank's rows of q and of k, v
  Rows rows;                              // this rank's results
};

// Ring attention forward and backward on this rank's slices of the gathered q, k, v, dout (any
// layout: each rank's slices are copies, q a strided one).
RingRun run_ring(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& dout) {
  const int r = world_rank(), P = world_size();
  RingRun run;
  if (c.layout == RingLayout::zigzag || !c.uneven) {
    run.q_seg = ring_segments(c.Lq, r, P, c.layout);
    run.k_seg = ring_segments(c.Lk, r, P, c.layout);
  } else {
    run.q_seg = contiguous_segments(uneven_lengths(c.Lq, P), r);
    run.k_seg = contiguous_segments(uneven_lengths(c.Lk, P), r);
  }
  const Tensor q_l = take(q, run.q_seg, -2), k_l = take(k, run.k_seg, -2),
               v_l = take(v, run.k_seg, -2), dout_l = take(dout, run.q_seg, -2);
  // A strided q (a transposed copy viewed back) so that non-contiguous inputs are exercised too.
  const Tensor q_strided = q_l.transpose(-1, -2).contiguous().transpose(-1, -2);

  const AttentionResult res =
      ring_attention(q_strided, k_l, v_l, c.options, MPI_COMM_WORLD, c.layout);
  const AttentionGrads g = ring_attention_backward(dout_l, q_strided, k_l, v_l, res.out, res.lse,
                                                   c.options, MPI_COMM_WORLD, c.layout);
  run.rows = {res.out, res.lse, g.dq, g.dk, g.dv};
  return run;
}

// Runs the case on every rank and returns the largest errors over all ranks against one process.
Errors run_case(const Case& c) {
  Shape qs = c.batch, ks = c.batch, vs = c.batch, os = c.batch;
  qs.insert(qs.end(), {c.Hq, c.Lq, c.D});
  ks.insert(ks.end(), {c.Hkv, c.Lk, c.D});
  vs.insert(vs.end(), {c.Hkv, c.Lk, c.Dv});
  os.insert(os.end(), {c.Hq, c.Lq, c.Dv});
  const Tensor q = random_tensor(qs, c.dtype, 1), k = random_tensor(ks, c.dtype, 2),
               v = random_tensor(vs, c.dtype, 3), dout = random_tensor(os, c.dtype, 4);

  // Single process on the gathered tensors: the cpu backend for f32 (auto), the reference for f64.
  const AttentionResult ref = attention(q, k, v, c.options);
  const AttentionGrads ref_g = attention_backward(dout, q, k, v, ref.out, ref.lse, c.options);
  const RingRun run = run_ring(c, q, k, v, dout);
  return errors(run.rows, take_rows(ref, ref_g, run.q_seg, run.k_seg));
}

void expect_close(const Case& c) {
  const double tol = c.dtype == DType::f64 ? 1e-12 : 1e-6;
  const Errors e = run_case(c);
  EXPECT_LE(e.out, tol) << c.name << " out";
  EXPECT_LE(e.lse, tol) << c.name << " lse";
  EXPECT_LE(e.dq, tol) << c.name << " dq";
  EXPECT_LE(e.dk, tol) << c.name << " dk";
  EXPECT_LE(e.dv, tol) << c.name << " dv";
}

Case make(const std::string& name, DType dtype, RingLayout layout) {
  Case c;
  c.name = fmt::format("{} {} {}", name, dtype_name(dtype), ring_layout_name(layout));
  c.dtype = dtype;
  c.layout = layout;
  return c;
}

class RingEquals : public ::testing::TestWithParam<std::tuple<DType, RingLayout>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  RingLayout layout() const { return std::get<1>(GetParam()); }
};

TEST_P(RingEquals, PositionOffset) {
  Case c = make("position offset", dtype(), layout());
  c.options.causal = true;
  c.options.position_offset = 5;
  c.Lq = 31;
  c.Lk = 43;
  expect_close(c);
}

TEST_P(RingEquals, PaddedKeys) {
  Case c = make("padded", dtype(), layout());
  c.batch = {3};
  c.Lq = 33;
  c.Lk = 37;
  c.options.key_lengths =
      Tensor::from_vector({3}, {30, 0, 11}, DType::i64);  // entry 1: every row fully masked
  expect_close(c);
  c.options.causal = true;
  c.options.align = Align::top_left;
  expect_close(c);
}

INSTANTIATE_TEST_SUITE_P(DtypesLayouts, RingEquals,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64),
                                            ::testing::Values(RingLayout::contiguous,
                                                              RingLayout::zigzag)),
                         [](const auto& param_info) {
                           return fmt::format("{}_{}", dtype_name(std::get<0>(param_info.param)),
                                              ring_layout_name(std::get<1>(param_info.param)));
                         });

TEST(Ring, UnevenContiguousSlicesWithAnEmptyRank) {
  for (bool causal : {false, true}) {
    Case c = make(causal ? "uneven causal" : "uneven", DType::f32, RingLayout::contiguous);
    c.uneven = true;
    c.Lq = c.Lk = 50;
    c.options.causal = causal;
    expect_close(c);
  }
}

// bf16 / f16: blocks are computed in f32 and merged in double, so the only rounding to 8 (11) bits
// is the final one, as in one process: the ring's error against the f64 truth is one process's
// (measured equal to 3 digits at -np 3 and 4; 1.2-1.7 times before blocks were computed in f32),
// held to 1.25 times here.
TEST(Ring, HalfPrecisionAsAccurateAsOneProcess) {
  const int r = world_rank(), P = world_size();
  for (DType dt : {DType::bf16, DType::f16}) {
    const Shape qs{2, 4, 53, 16}, ks{2, 2, 53, 16};
    const Tensor q = random_tensor(qs, dt, 1), k = random_tensor(ks, dt, 2),
                 v = random_tensor(ks, dt, 3), dout = random_tensor(qs, dt, 4);
    AttentionOptions o;
    o.causal = true;
    const AttentionResult one = attention(q, k, v, o);
    const AttentionGrads one_g = attention_backward(dout, q, k, v, one.out, one.lse, o);
    const AttentionResult truth =
        attention(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), o);
    const AttentionGrads truth_g =
        attention_backward(dout.to(DType::f64), q.to(DType::f64), k.to(DType::f64),
                           v.to(DType::f64), truth.out, truth.lse, o);
    const RingLayout zz = RingLayout::zigzag;
    auto shard = [&](const Tensor& t) { return ring_shard(t, r, P, zz); };
    const AttentionResult ring =
        ring_attention(shard(q), shard(k), shard(v), o, MPI_COMM_WORLD, zz);
    const AttentionGrads ring_g = ring_attention_backward(
        shard(dout), shard(q), shard(k), shard(v), ring.out, ring.lse, o, MPI_COMM_WORLD, zz);
    const std::pair<const char*, std::tuple<Tensor, Tensor, Tensor>> checks[] = {
        {"out", {ring.out, shard(one.out), shard(truth.out)}},
        {"dq", {ring_g.dq, shard(one_g.dq), shard(truth_g.dq)}},
        {"dk", {ring_g.dk, shard(one_g.dk), shard(truth_g.dk)}},
        {"dv", {ring_g.dv, shard(one_g.dv), shard(truth_g.dv)}}};
    for (const auto& [name, t] : checks) {
      const double e_ring = max_over_ranks(rel_err(std::get<0>(t), std::get<2>(t)));
      const double e_one = max_over_ranks(rel_err(std::get<1>(t), std::get<2>(t)));
      EXPECT_LE(e_ring, 1.25 * e_one) << dtype_name(dt) << " " << name << ": one process " << e_one;
    }
  }
}

TEST(Ring, ShardAndGatherRoundTrip) {
  const int r = world_rank(), P = world_size();
  const Tensor full = random_tensor({2, 3, 41, 5}, DType::f32, 9);
  for (RingLayout layout : {RingLayout::contiguous, RingLayout::zigzag}) {
    const Tensor local = ring_shard(full, r, P, layout);
    const Tensor back = ring_gather(local, layout, MPI_COMM_WORLD);
    EXPECT_EQ(max_over_ranks(rel_err(back, full)), 0.0) << ring_layout_name(layout);
  }
  // Segments cover [0, L) exactly once.
  for (int64_t L : {0, 1, 7, 41}) {
    std::vector<int> hits(static_cast<size_t>(L), 0);
    for (int rr = 0; rr < P; ++rr) {
      for (const RingSegment& s : ring_segments(L, rr, P, RingLayout::zigzag)) {
        for (int64_t i = s.start; i < s.start + s.length; ++i) ++hits[i];
      }
    }
    for (int64_t i = 0; i < L; ++i) EXPECT_EQ(hits[i], 1) << "L " << L << " position " << i;
  }
}

// The schedule's rectangles hold every allowed (i, j) and its rows are exactly the rows that meet a
// key.
TEST(RingPlan, ConnectMatchesBruteForce) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> u(-3, 12);
  for (int trial = 0; trial < 3000; ++trial) {
    distributed::PositionBounds b;
    b.offset = u(gen);
    b.left = std::max(-1, u(gen) - 2);
    b.right = std::max(-1, u(gen) - 4);
    b.key_limit = std::max(0, u(gen) + 3);
    const int64_t qs = std::max(0, u(gen)), qe = qs + std::max(0, u(gen));
    const int64_t ks = std::max(0, u(gen)), ke = ks + std::max(0, u(gen));
    const distributed::Box box = distributed::connect(b, qs, qe, ks, ke);
    int64_t i0 = -1, i1 = -1, j0 = 1 << 20, j1 = -1;
    for (int64_t i = qs; i < qe; ++i) {
      for (int64_t j = ks; j < ke; ++j) {
        const int64_t p = i + b.offset;
        const bool ok =
            (b.left < 0 || j >= p - b.left) && (b.right < 0 || j <= p + b.right) && j < b.key_limit;
        if (!ok) continue;
        if (i0 < 0) i0 = i;
        i1 = i + 1;
        j0 = std::min(j0, j);
        j1 = std::max(j1, j + 1);
      }
    }
    if (i0 < 0) {
      EXPECT_TRUE(box.empty()) << "trial " << trial;
    } else {
      EXPECT_EQ(box.i0, i0) << "trial " << trial;
      EXPECT_EQ(box.i1, i1) << "trial " << trial;
      EXPECT_EQ(box.j0, j0) << "trial " << trial;
      EXPECT_EQ(box.j1, j1) << "trial " << trial;
    }
  }
}

// Under a causal mask with contiguous slices block s is needed by ranks s .. P-1 only; under a
// narrow window by the next rank only: blocks stop travelling there.
TEST(RingPlan, BlocksStopWhereTheMaskEnds) {
  const int P = 4;
  std::vector<std::vector<RingSegment>> segs(P);
  for (int r = 0; r < P; ++r) segs[r] = ring_segments(400, r, P, RingLayout::contiguous);
  distributed::PositionBounds causal{0, -1, 0, 400};
  const distributed::Plan a = distributed::make_plan(causal, segs, segs);
  for (int s = 0; s < P; ++s) EXPECT_EQ(a.hops[s], P - 1 - s) << "block " << s;
  distributed::PositionBounds window{0, 10, 0, 400};
  const distributed::Plan b = distributed::make_plan(window, segs, segs);
  for (int s = 0; s < P; ++s) EXPECT_EQ(b.hops[s], s + 1 < P ? 1 : 0) << "block " << s;
  std::vector<std::vector<RingSegment>> zz(P);
  for (int r = 0; r < P; ++r) zz[r] = ring_segments(400, r, P, RingLayout::zigzag);
  const distributed::Plan c = distributed::make_plan(causal, zz, zz);
  for (int s = 0; s < P; ++s) EXPECT_EQ(c.hops[s], P - 1) << "zigzag block " << s;
}

// The same, observed on the real calls: blocks the mask removes are neither computed nor sent.
TEST(RingPlan, MaskedBlocksAreNotComputedOrSent) {
  const int r = world_rank(), P = world_size();
  const int64_t L = 40 * P, n = 40;  // contiguous slices of 40 positions
  const Tensor q =
      ring_shard(random_tensor({1, 2, L, 8}, DType::f32, 1), r, P, RingLayout::contiguous);
  const int64_t block_bytes = 2 * 2 * n * 8 * 4;  // K and V: [1, 2, 40, 8] f32 each
  AttentionOptions causal;
  causal.causal = true;
  ring_attention(q, q, q, causal, MPI_COMM_WORLD);
  RingStats st = ring_last_stats();
  // Rank r's queries use blocks 0..r, and block s travels P-1-s hops: rank r forwards the block it
  // holds at step t (s = r - t) while t + 1 <= P - 1 - s.
  int64_t sends = 0;
  for (int t = 0; t < P; ++t) {
    const int s = (r - t + P) % P;
    if (t + 1 <= P - 1 - s) ++sends;
  }
  EXPECT_EQ(max_over_ranks(std::abs(st.blocks_computed - (r + 1))), 0.0) << "causal, rank " << r;
  EXPECT_EQ(max_over_ranks(std::abs(static_cast<double>(st.bytes_sent - sends * block_bytes))),
            0.0);
  EXPECT_EQ(st.steps, P);

  AttentionOptions window;  // each query sees 5 keys back: only the left neighbour's block
  window.causal = true;
  window.window = {5, 0};
  ring_attention(q, q, q, window, MPI_COMM_WORLD);
  st = ring_last_stats();
  EXPECT_EQ(max_over_ranks(std::abs(st.blocks_computed - (r > 0 ? 2 : 1))), 0.0)
      << "window, rank " << r;
  EXPECT_EQ(
      max_over_ranks(std::abs(static_cast<double>(st.bytes_sent - (r + 1 < P ? block_bytes : 0)))),
      0.0);

  const Tensor qz =
      ring_shard(random_tensor({1, 2, L, 8}, DType::f32, 1), r, P, RingLayout::zigzag);
  ring_attention(qz, qz, qz, causal, MPI_COMM_WORLD, RingLayout::zigzag);
  EXPECT_EQ(max_over_ranks(std::abs(ring_last_stats().blocks_computed - P)), 0.0)
      << "zigzag computes every step";
}

// ---- Errors are collective: every rank throws the same attn::Error, none hangs. ----

// Runs fn on every rank; returns the message every rank caught ("" if none threw) after checking
// that all ranks threw attn::Error with the same message.
template <class Fn>
std::string collective_error(Fn&& fn) {
  std::string msg;
  int threw = 0;
  try {
    fn();
  } catch (const Error& e) {
    threw = 1;
    msg = e.what();
  }
  int all_threw = 0, any_threw = 0;
  MPI_Allreduce(&threw, &all_threw, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&threw, &any_threw, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(all_threw, any_threw) << "some ranks threw and some did not: " << msg;
  // Same message everywhere: compare lengths and a hash.
  uint64_t h = std::hash<std::string>{}(msg), h_min = 0, h_max = 0;
  MPI_Allreduce(&h, &h_min, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &h_max, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(h_min, h_max) << "ranks caught different messages; this one: " << msg;
  return msg;
}

struct Inputs {
  Tensor q, k, v;
};
Inputs local_inputs(int64_t L, RingLayout layout, DType dtype = DType::f32) {
  const int r = world_rank(), P = world_size();
  return {ring_shard(random_tensor({2, 2, L, 8}, dtype, 1), r, P, layout),
          ring_shard(random_tensor({2, 2, L, 8}, dtype, 2), r, P, layout),
          ring_shard(random_tensor({2, 2, L, 8}, dtype, 3), r, P, layout)};
}

TEST(RingErrors, BadShapeOnOneRankStopsEveryRank) {
  const int r = world_rank(), P = world_size();
  Inputs in = local_inputs(30, RingLayout::contiguous);
  if (r == P - 1)
    in.k = random_tensor({2, 2, in.k.size(-2), 7}, DType::f32, 5);  // head dim 7 vs q's 8
  const std::string msg =
      collective_error([&] { ring_attention(in.q, in.k, in.v, {}, MPI_COMM_WORLD); });
  EXPECT_NE(msg.find("attn::ring_attention"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("rank {} of {}", P - 1, P)), std::string::npos) << msg;
  EXPECT_NE(msg.find("head dim"), std::string::npos) << msg;
}

TEST(RingErrors, ShapesThatDisagreeAcrossRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks or more (ctest runs 2, 3 and 4)";
  const int r = world_rank();
  Inputs in = local_inputs(30, RingLayout::contiguous);
  if (r == 1) {  // consistent on its own, but 3 heads where the others have 2
    in.q = random_tensor({2, 3, in.q.size(-2), 8}, DType::f32, 5);
    in.k = random_tensor({2, 3, in.k.size(-2), 8}, DType::f32, 6);
    in.v = random_tensor({2, 3, in.v.size(-2), 8}, DType::f32, 7);
  }
  const std::string msg =
      collective_error([&] { ring_attention(in.q, in.k, in.v, {}, MPI_COMM_WORLD); });
  EXPECT_NE(msg.find("rank 1 has q"), std::string::npos) << msg;
}

TEST(RingErrors, OptionsThatDisagreeAcrossRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks or more (ctest runs 2, 3 and 4)";
  Inputs in = local_inputs(30, RingLayout::contiguous);
  AttentionOptions o;
  o.causal = world_rank() == 0;
  const std::string msg =
      collective_error([&] { ring_attention(in.q, in.k, in.v, o, MPI_COMM_WORLD); });
  EXPECT_NE(msg.find("options of rank"), std::string::npos) << msg;
}

// Every option the ring passes to its blocks (attn/options.h's RingUse::agree rows) is compared
// across ranks, and the message names them all.
TEST(RingErrors, EveryAgreedOptionIsCompared) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks or more (ctest runs 2, 3 and 4)";
  const bool r0 = world_rank() == 0;
  Inputs in = local_inputs(30, RingLayout::contiguous);
  std::vector<AttentionOptions> cases(8);
  cases[0].causal = r0;
  cases[1].align = r0 ? Align::top_left : Align::bottom_right;
  cases[2].position_offset = r0 ? 1 : 2;
  cases[3].window = {r0 ? 3 : 4, -1};
  cases[4].scale = r0 ? 0.5 : 0.25;
  cases[5].softcap = r0 ? 5.0 : 6.0;
  cases[6].alibi_slopes = Tensor::from_vector({2}, {0.5, r0 ? 0.25 : 0.125}, DType::f32);
  cases[7].key_lengths = Tensor::from_vector({2}, {20, r0 ? 25.0 : 26.0}, DType::i64);
  for (size_t n = 0; n < cases.size(); ++n) {
    const AttentionOptions& o = cases[n];
    const std::string msg =
        collective_error([&] { ring_attention(in.q, in.k, in.v, o, MPI_COMM_WORLD); });
    EXPECT_EQ(msg,
              "attn::ring_attention: the options of rank 1 differ from rank 0's (causal, align, "
              "position_offset, window, scale, softcap, alibi_slopes, key_lengths and the layout "
              "must be equal on every rank) (every rank stopped)")
        << "case " << n;
  }
}

TEST(RingErrors, LengthsThatDoNotFitTheZigzagLayout) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks or more (ctest runs 2, 3 and 4)";
  const int r = world_rank(), P = world_size();
  // Contiguous slices of very uneven length handed in as zigzag.
  std::vector<int64_t> len = uneven_lengths(30, P);
  const Tensor q =
      take(random_tensor({1, 2, 30, 8}, DType::f32, 1), contiguous_segments(len, r), -2);
  const std::string msg =
      collective_error([&] { ring_attention(q, q, q, {}, MPI_COMM_WORLD, RingLayout::zigzag); });
  EXPECT_NE(msg.find("zigzag layout"), std::string::npos) << msg;
}

TEST(RingErrors, KeyLengthsBeyondTheGlobalLength) {
  Inputs in = local_inputs(30, RingLayout::contiguous);
  AttentionOptions o;
  o.key_lengths = Tensor::from_vector({2}, {30, 31}, DType::i64);
  const std::string msg =
      collective_error([&] { ring_attention(in.q, in.k, in.v, o, MPI_COMM_WORLD); });
  EXPECT_NE(msg.find("key_lengths[1] = 31"), std::string::npos) << msg;
}

TEST(RingErrors, RefusedOptions) {
  Inputs in = local_inputs(30, RingLayout::contiguous);
  AttentionOptions mask;
  mask.mask = Tensor::full({1}, 1.0, DType::boolean);
  EXPECT_NE(collective_error([&] {
              ring_attention(in.q, in.k, in.v, mask, MPI_COMM_WORLD);
            }).find("dense masks"),
            std::string::npos);
  AttentionOptions drop;
  drop.dropout_p = 0.1;
  EXPECT_NE(collective_error([&] {
              ring_attention(in.q, in.k, in.v, drop, MPI_COMM_WORLD);
            }).find("dropout"),
            std::string::npos);
  AttentionOptions weights;
  weights.return_weights = true;
  EXPECT_NE(collective_error([&] {
              ring_attention(in.q, in.k, in.v, weights, MPI_COMM_WORLD);
            }).find("return_weights"),
            std::string::npos);
}

TEST(RingErrors, BackwardWithMismatchedGradientShape) {
  const int r = world_rank();
  Inputs in = local_inputs(30, RingLayout::contiguous);
  const AttentionResult res = ring_attention(in.q, in.k, in.v, {}, MPI_COMM_WORLD);
  Tensor dout = res.out;
  if (r == 0) dout = random_tensor({2, 2, 1, 8}, DType::f32, 3);
  const std::string msg = collective_error([&] {
    ring_attention_backward(dout, in.q, in.k, in.v, res.out, res.lse, {}, MPI_COMM_WORLD);
  });
  EXPECT_NE(msg.find("attn::ring_attention_backward: rank 0 of"), std::string::npos) << msg;
}

// A rank that fails in the middle of the ring (after validation, with blocks in flight) still
// passes blocks on; every rank then throws its error. Afterwards the ring works again (no stray
// messages are left).
TEST(RingErrors, FailureWhileComputingStopsEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks or more (ctest runs 2, 3 and 4)";
  const int r = world_rank(), P = world_size();
  for (RingLayout layout : {RingLayout::contiguous, RingLayout::zigzag}) {
    Inputs in = local_inputs(41, layout);
    AttentionOptions o;
    o.causal = true;
    if (r == P - 1) testing::ring_fail_at_step(1);
    std::string msg =
        collective_error([&] { ring_attention(in.q, in.k, in.v, o, MPI_COMM_WORLD, layout); });
    EXPECT_NE(msg.find(fmt::format("rank {} of {}", P - 1, P)), std::string::npos) << msg;
    EXPECT_NE(msg.find("injected failure at ring step 1"), std::string::npos) << msg;

    const AttentionResult res = ring_attention(in.q, in.k, in.v, o, MPI_COMM_WORLD, layout);
    const Tensor dout = res.out;
    if (r == 0)
      testing::ring_fail_at_step(P - 1);  // the last step: rank 0 only relays there under causal
    msg = collective_error([&] {
      ring_attention_backward(dout, in.q, in.k, in.v, res.out, res.lse, o, MPI_COMM_WORLD, layout);
    });
    EXPECT_NE(msg.find(fmt::format("attn::ring_attention_backward: rank 0 of {}", P)),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(fmt::format("injected failure at ring step {}", P - 1)), std::string::npos)
        << msg;

    // And the next calls succeed on every rank.
    EXPECT_EQ(collective_error([&] {
                const AttentionResult again =
                    ring_attention(in.q, in.k, in.v, o, MPI_COMM_WORLD, layout);
                ring_attention_backward(dout, in.q, in.k, in.v, again.out, again.lse, o,
                                        MPI_COMM_WORLD, layout);
              }),
              "");
  }
}

// ---- The conformance cases (tests/cases/attention_cases.txt), both layouts. ----

// The option of a case that ring attention refuses (the first in the order of its validation,
// src/distributed/ring_validate.cc) and the words its error names it with; empty when the ring runs
// the case.
std::pair<std::string, std::string> ring_refusal(const test::CaseSpec& s) {
  if (s.mask) return {"mask", "dense masks are not supported"};
  if (s.block_layout) return {"block layout", "block layouts are not supported"};
  if (s.dropout != 0.0) return {"dropout", "dropout is not supported"};
  return {};
}

class RingConformance : public ::testing::TestWithParam<std::tuple<test::NamedCase, RingLayout>> {};

// f32 cases: every rank's rows equal one process's on the same values within 1e-6, and again in
// f64 within 1e-12; bf16 cases: the ring's error against the f64 truth at most 1.25 times one
// process's (HalfPrecisionAsAccurateAsOneProcess's rule). Cases with an option the ring refuses:
// every rank throws an error that names it. The case's memory layout is that of the gathered
// tensors; each rank's slices are copies (run_ring).
TEST_P(RingConformance, EqualsOneProcess) {
  const auto& [nc, layout] = GetParam();
  const test::CaseSpec& s = nc.spec;
  const std::string what =
      fmt::format("case {} ({}): {}", nc.name, ring_layout_name(layout), s.describe());
  SCOPED_TRACE(what);
  const test::Case tc = test::make_case(s, nc.seed);
  Case c;
  c.name = nc.name;
  c.batch = s.batch;
  c.Hq = s.Hq, c.Hkv = s.Hkv, c.Lq = s.Lq, c.Lk = s.Lk, c.D = s.D, c.Dv = s.Dv;
  c.dtype = s.dtype;
  c.layout = layout;
  c.options = tc.o;
  c.options.backend =
      Backend::automatic;  // one process: the cpu backend (f32, bf16), the reference (f64)
  const int r = world_rank(), P = world_size();

  const auto [option, words] = ring_refusal(s);
  if (!option.empty()) {
    auto shard = [&](const Tensor& t) { return ring_shard(t, r, P, layout); };
    const std::string msg = collective_error([&] {
      ring_attention(shard(tc.q), shard(tc.k), shard(tc.v), c.options, MPI_COMM_WORLD, layout);
    });
    EXPECT_NE(msg.find(words), std::string::npos)
        << "the ring must refuse the " << option << ": '" << msg << "'";
    if (r == 0) std::printf("[ REFUSED  ] %s: %s\n", nc.name.c_str(), msg.c_str());
    return;
  }

  const Tensor dout =
      test::random_tensor(test::cat(s.batch, {s.Hq, s.Lq, s.Dv}), s.dtype, nc.seed + 99, -1.0, 1.0);
  auto one_process = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& d,
                         const std::vector<RingSegment>& qs, const std::vector<RingSegment>& ks) {
    const AttentionResult f = attention(q, k, v, c.options);
    return take_rows(f, attention_backward(d, q, k, v, f.out, f.lse, c.options), qs, ks);
  };
  const RingRun ring = run_ring(c, tc.q, tc.k, tc.v, dout);
  if (s.dtype == DType::bf16) {
    const test::Case t64 = test::to_dtype(tc, DType::f64);
    const Rows truth =
        one_process(t64.q, t64.k, t64.v, dout.to(DType::f64), ring.q_seg, ring.k_seg);
    const Errors e_ring = errors(ring.rows, truth);
    const Errors e_one = errors(one_process(tc.q, tc.k, tc.v, dout, ring.q_seg, ring.k_seg), truth);
    EXPECT_LE(e_ring.out, 1.25 * e_one.out) << "out";
    EXPECT_LE(e_ring.dq, 1.25 * e_one.dq) << "dq";
    EXPECT_LE(e_ring.dk, 1.25 * e_one.dk) << "dk";
    EXPECT_LE(e_ring.dv, 1.25 * e_one.dv) << "dv";
    return;
  }
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const test::Case t = test::to_dtype(tc, dtype);
    const Tensor d = dout.to(dtype);
    const RingRun run = dtype == s.dtype ? ring : run_ring(c, t.q, t.k, t.v, d);
    const Errors e = errors(run.rows, one_process(t.q, t.k, t.v, d, run.q_seg, run.k_seg));
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-6;
    EXPECT_LE(e.out, tol) << "out";
    EXPECT_LE(e.lse, tol) << "lse";
    EXPECT_LE(e.dq, tol) << "dq";
    EXPECT_LE(e.dk, tol) << "dk";
    EXPECT_LE(e.dv, tol) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RingConformance,
                         ::testing::Combine(::testing::ValuesIn(test::conformance_cases()),
                                            ::testing::Values(RingLayout::contiguous,
                                                              RingLayout::zigzag)),
                         [](const auto& param_info) {
                           return fmt::format("{}_{}", std::get<0>(param_info.param).name,
                                              ring_layout_name(std::get<1>(param_info.param)));
                         });

}  // namespace
}  // namespace attn

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank prints; every rank runs every (collective) test
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
