// Ring attention over MPI: forward and backward (include/attn/ring.h).
//
// Shapes on rank r (BH = batch x Hq rows of q, BHkv = batch x Hkv rows of k and v):
//   q_local [..., Hq, Lq_r, D], k_local [..., Hkv, Lk_r, D], v_local [..., Hkv, Lk_r, Dv]
// Block s = the K/V of rank s, packed as K [..., Hkv, Lk_s, D] then V [..., Hkv, Lk_s, Dv] in one
// buffer.
//
// Forward, step t = 0 .. P-1: rank r holds block s = r - t (mod P). It posts the receive of block s
// - 1 from its left neighbour and the send of block s to its right one, computes attention of its
// queries against block s (only the rectangles the position rule connects, see ring_plan.h), merges
// the partial (out, lse) into its running result exactly:
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b,
// then waits for both transfers. Block s stops after hops[s] steps: no rank further on needs it.
//
// Backward: with the global out and lse of a row, attention_backward on one block gives exactly
// that block's terms of dq (its sum over the block's keys) and of dk, dv (their sums over this
// rank's queries), because P_ij = exp(s_ij - lse_i) and D_i = dO_i . O_i are global quantities. dq
// sums locally. dK/dV accumulators (f32, f64 for f64 inputs) travel one step behind their K/V
// block: at step t a rank computes its terms for block s into `part`, then adds the accumulator
// that arrives from the left and sends the sum right (overlapping the next step's compute); after
// the last rank that needs block s, the sum goes home to s.
#include "attn/ring.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "distributed/ring_comm.h"
#include "distributed/ring_plan.h"

namespace attn {

namespace {
thread_local RingStats g_last_stats;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

RingStats ring_last_stats() {
  return g_last_stats;
}

namespace testing {
namespace {
std::atomic<int> g_fail_step{-1};
}
void ring_fail_at_step(int step) {
  g_fail_step.store(step);
}
}  // namespace testing

namespace {

using distributed::Box;
using distributed::Plan;
using distributed::PrivateComm;

constexpr int kTagKV = 101, kTagDKV = 102, kTagHome = 103;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

DType acc_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// FNV-1a over the options that must be equal on every rank.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  template <class T>
  void add(const T& v) {
    bytes(&v, sizeof(v));
  }
};

// What each rank tells the others once per call (fixed size for one MPI_Allgather).
struct RankMeta {
  int32_t ndim = 0;
  int32_t dtype = 0;
  int64_t q[kMaxDims] = {}, k[kMaxDims] = {}, v[kMaxDims] = {};
  uint64_t options_hash = 0;
};

struct Setup {
  Plan plan;
  Shape batch;
  int64_t B = 1, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  int64_t BH = 0, BHkv = 0;
  DType dtype = DType::f32;
  std::vector<int64_t> key_lengths;  // global, [B]; empty = none
};

std::string shape_of(const int64_t* s, int n) {
  return shape_to_string(Shape(s, s + n));
}

// Rank-local checks; returns "" or the message. Fills `meta` and the key lengths.
std::string validate_local(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionOptions& o, RingLayout layout, const Tensor* dout,
                           const Tensor* out, const Tensor* lse, RankMeta* meta,
                           std::vector<int64_t>* key_lengths) {
  for (auto [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (!t->defined()) return fmt::format("{}: {} is undefined", fn, name);
    if (t->dim() < 3 || t->dim() > kMaxDims) {
      return fmt::format("{}: {} must have rank 3 to {} ([..., heads, length, dim]), got shape {}",
                         fn, name, kMaxDims, t->shape_str());
    }
  }
  if (o.mask.defined()) {
    return fmt::format(
        "{}: dense masks are not supported (mask {}): a rank cannot see the mask's global columns; "
        "use causal, window or key_lengths",
        fn, o.mask.shape_str());
  }
  if (o.block_layout.layout.defined()) {
    return fmt::format("{}: block layouts are not supported (layout {})", fn,
                       o.block_layout.layout.shape_str());
  }
  if (o.dropout_p != 0.0) {
    return fmt::format(
        "{}: dropout is not supported (dropout_p = {}): its keep-pattern is a function of global "
        "positions that the per-block calls do not see",
        fn, o.dropout_p);
  }
  if (o.return_weights)
    return fmt::format("{}: return_weights is not supported (the weights are Lq x Lk)", fn);
  if (o.mask_grad) return fmt::format("{}: mask_grad is not supported (no dense masks)", fn);

  // attn::attention's own validation, on empty slices: shapes, dtypes, heads, scale, softcap,
  // window, ALiBi, backend. key_lengths are checked below against the global key length.
  AttentionOptions dry = o;
  dry.key_lengths = Tensor();
  const Tensor q0 = q.slice(-2, 0, 0), k0 = k.slice(-2, 0, 0), v0 = v.slice(-2, 0, 0);
  try {
    if (dout == nullptr) {
      (void)attention(q0, k0, v0, dry);
    } else {
      for (auto [name, t] :
           {std::pair{"dout", dout}, std::pair{"out", out}, std::pair{"lse", lse}}) {
        if (!t->defined()) return fmt::format("{}: {} is undefined", fn, name);
      }
      Shape out_shape = q.shape(), lse_shape = q.shape();
      out_shape.back() = v.size(-1);
      lse_shape.pop_back();
      if (dout->shape() != out_shape || out->shape() != out_shape || lse->shape() != lse_shape) {
        return fmt::format(
            "{}: dout and out must have shape {} and lse {} (from q {} and v {}), got dout {}, out "
            "{}, "
            "lse {}",
            fn, shape_to_string(out_shape), shape_to_string(lse_shape), q.shape_str(),
            v.shape_str(), dout->shape_str(), out->shape_str(), lse->shape_str());
      }
      (void)attention_backward(dout->slice(-2, 0, 0), q0, k0, v0, out->slice(-2, 0, 0),
                               lse->slice(-1, 0, 0), dry);
    }
  } catch (const Error& e) {
    return fmt::format("{}: {}", fn, e.what());
  }

  const Shape batch(q.shape().begin(), q.shape().end() - 3);
  const int64_t B = checked_numel(batch, fn);
  key_lengths->clear();
  if (o.key_lengths.defined()) {
    const Tensor& kl = o.key_lengths;
    if (kl.dtype() != DType::i32 && kl.dtype() != DType::i64) {
      return fmt::format("{}: key_lengths must be i32 or i64, got {} with shape {}", fn,
                         dtype_name(kl.dtype()), kl.shape_str());
    }
    if (!(kl.shape() == batch || (kl.dim() == 1 && kl.size(0) == B) ||
          (B == 1 && kl.numel() == 1))) {
      return fmt::format("{}: key_lengths of shape {} must have the batch dims' shape {} (or [{}])",
                         fn, kl.shape_str(), shape_to_string(batch), B);
    }
    for (double x : kl.to_vector()) {
      if (x < 0) return fmt::format("{}: key_lengths holds {} < 0", fn, x);
      key_lengths->push_back(static_cast<int64_t>(x));
    }
  }

  meta->ndim = q.dim();
  meta->dtype = static_cast<int32_t>(q.dtype());
  for (int d = 0; d < q.dim(); ++d) {
    meta->q[d] = q.size(d);
    meta->k[d] = k.size(d);
    meta->v[d] = v.size(d);
  }
  Hash h;
  h.add(o.causal);
  h.add(o.align);
  h.add(o.position_offset.has_value());
  h.add(o.position_offset.value_or(0));
  h.add(o.window.left);
  h.add(o.window.right);
  h.add(o.scale.has_value());
  h.add(o.scale.value_or(0.0));
  h.add(o.softcap.has_value());
  h.add(o.softcap.value_or(0.0));
  h.add(layout);
  if (o.alibi_slopes.defined()) {
    for (double s : o.alibi_slopes.to_vector()) h.add(s);
  }
  h.add(key_lengths->size());
  for (int64_t x : *key_lengths) h.add(x);
  meta->options_hash = h.h;
  return {};
}

// Checks that need every rank's metadata; the same verdict on every rank (same data).
std::string validate_global(const char* fn, const std::vector<RankMeta>& all,
                            const AttentionOptions& o, RingLayout layout,
                            const std::vector<int64_t>& key_lengths, Setup* s) {
  const int P = static_cast<int>(all.size());
  const RankMeta& a0 = all[0];
  for (int r = 1; r < P; ++r) {
    const RankMeta& a = all[r];
    if (a.ndim != a0.ndim || a.dtype != a0.dtype) {
      return fmt::format(
          "{}: rank {} has q of rank {} and dtype {}, rank 0 of rank {} and dtype {}", fn, r,
          a.ndim, dtype_name(static_cast<DType>(a.dtype)), a0.ndim,
          dtype_name(static_cast<DType>(a0.dtype)));
    }
    for (auto [name, x, x0] :
         {std::tuple{"q", a.q, a0.q}, std::tuple{"k", a.k, a0.k}, std::tuple{"v", a.v, a0.v}}) {
      for (int d = 0; d < a.ndim; ++d) {
        if (d != a.ndim - 2 && x[d] != x0[d]) {
          return fmt::format(
              "{}: rank {} has {} {} but rank 0 has {} {} (only the sequence dim, -2, may differ)",
              fn, r, name, shape_of(x, a.ndim), name, shape_of(x0, a0.ndim));
        }
      }
    }
    if (a.options_hash != a0.options_hash) {
      return fmt::format(
          "{}: the options of rank {} differ from rank 0's (causal, align, position_offset, "
          "window, "
          "scale, softcap, alibi_slopes, key_lengths and the layout must be equal on every rank)",
          fn, r);
    }
  }
  const int n = a0.ndim;
  s->batch = Shape(a0.q, a0.q + n - 3);
  s->B = checked_numel(s->batch, fn);
  s->Hq = a0.q[n - 3];
  s->Hkv = a0.k[n - 3];
  s->D = a0.q[n - 1];
  s->Dv = a0.v[n - 1];
  s->BH = s->B * s->Hq;
  s->BHkv = s->B * s->Hkv;
  s->dtype = static_cast<DType>(a0.dtype);

  int64_t Lq = 0, Lk = 0;
  for (const RankMeta& a : all) {
    Lq += a.q[n - 2];
    Lk += a.k[n - 2];
  }
  std::vector<std::vector<RingSegment>> q_segs(P), k_segs(P);
  int64_t q_start = 0, k_start = 0;
  for (int r = 0; r < P; ++r) {
    const int64_t lq = all[r].q[n - 2], lk = all[r].k[n - 2];
    if (layout == RingLayout::contiguous) {
      q_segs[r] = {{q_start, lq, 0}};
      k_segs[r] = {{k_start, lk, 0}};
      q_start += lq;
      k_start += lk;
    } else {
      q_segs[r] = ring_segments(Lq, r, P, layout);
      k_segs[r] = ring_segments(Lk, r, P, layout);
      const int64_t want_q = q_segs[r][0].length + q_segs[r][1].length;
      const int64_t want_k = k_segs[r][0].length + k_segs[r][1].length;
      if (lq != want_q || lk != want_k) {
        return fmt::format(
            "{}: rank {} holds {} queries and {} keys, but the zigzag layout of Lq = {} and Lk = "
            "{} "
            "over {} ranks gives it {} and {} (use attn::ring_shard)",
            fn, r, lq, lk, Lq, Lk, P, want_q, want_k);
      }
    }
  }
  int64_t key_limit = Lk;
  if (!key_lengths.empty()) {
    key_limit = 0;
    for (size_t b = 0; b < key_lengths.size(); ++b) {
      if (key_lengths[b] > Lk) {
        return fmt::format(
            "{}: key_lengths[{}] = {} is outside [0, Lk = {}] (the global key length)", fn, b,
            key_lengths[b], Lk);
      }
      key_limit = std::max(key_limit, key_lengths[b]);
    }
  }
  s->key_lengths = key_lengths;

  distributed::PositionBounds bounds;
  bounds.offset =
      o.position_offset ? *o.position_offset : (o.align == Align::bottom_right ? Lk - Lq : 0);
  // A bound this wide allows every key a real position can reach: treat it as unbounded (and avoid
  // overflow).
  constexpr int64_t kWide = int64_t{1} << 62;
  bounds.left = o.window.left >= kWide ? -1 : o.window.left;
  bounds.right = o.window.right >= kWide ? -1 : o.window.right;
  if (o.causal) bounds.right = bounds.right < 0 ? 0 : std::min<int64_t>(bounds.right, 0);
  bounds.key_limit = key_limit;
  s->plan = distributed::make_plan(bounds, std::move(q_segs), std::move(k_segs));
  return {};
}

// Validates on every rank and agrees: returns the setup on every rank or throws the same
// attn::Error on every rank. Nothing has been sent yet when it throws.
Setup collective_setup(const char* fn, const PrivateComm& pc, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& o, RingLayout layout,
                       const Tensor* dout = nullptr, const Tensor* out = nullptr,
                       const Tensor* lse = nullptr) {
  RankMeta meta;
  std::vector<int64_t> key_lengths;
  std::string error;
  try {
    error = validate_local(fn, q, k, v, o, layout, dout, out, lse, &meta, &key_lengths);
  } catch (const std::exception& e) {
    error = fmt::format("{}: {}", fn, e.what());
  }
  const std::string agreed = distributed::agree_on_error(pc.get(), fn, error);
  if (!agreed.empty()) throw Error(fmt::format("{} (every rank stopped)", agreed));
  std::vector<RankMeta> all(pc.size());
  MPI_Allgather(&meta, sizeof(RankMeta), MPI_BYTE, all.data(), sizeof(RankMeta), MPI_BYTE,
                pc.get());
  Setup s;
  error = validate_global(fn, all, o, layout, key_lengths, &s);
  if (!error.empty()) throw Error(fmt::format("{} (every rank stopped)", error));
  return s;
}

// A byte buffer for one travelling block.
struct Buffer {
  std::unique_ptr<std::byte[]> bytes;
  size_t size = 0;
  void reserve(size_t n) {
    if (n > static_cast<size_t>(std::numeric_limits<std::ptrdiff_t>::max())) throw std::bad_alloc();
    bytes.reset(new std::byte[n]);  // uninitialised: every use writes before it reads
    size = n;
  }
  std::byte* data() const { return bytes.get(); }
};

Shape with_length(const Shape& batch, int64_t heads, int64_t length, int64_t dim) {
  Shape s = batch;
  s.insert(s.end(), {heads, length, dim});
  return s;
}

// The K and V views of block s inside a buffer holding K then V of `dtype`.
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

// One attention call's worth of work: global rows [i0, i1) against the keys [j0, j1) of a block,
// with the block's keys starting at global position k_start stored from local offset k_local.
struct Piece {
  int64_t i0, i1, j0, j1;
  int64_t q_local;   // local row of i0
  int64_t k_offset;  // local key index of j0 inside the block
};

// The pieces of rank r against block s: every connected rectangle, long ones cut by rows so that
// MPI can be poked between them (transfers that need progress calls advance during the
// computation).
std::vector<Piece> pieces_of(const Plan& plan, int r, int s) {
  std::vector<Piece> out;
  for (const RingSegment& qs : plan.q_segs[r]) {
    for (const RingSegment& ks : plan.k_segs[s]) {
      const Box box = distributed::connect(plan.bounds, qs.start, qs.start + qs.length, ks.start,
                                           ks.start + ks.length);
      if (box.empty()) continue;
      const int64_t rows = box.i1 - box.i0;
      // Cut only long row ranges: every call packs the block's K/V again, so 256-row pieces of a
      // 1024-row block cost 20% here; 2048 rows and more amortise it.
      const int64_t n_parts = std::clamp<int64_t>(rows / 2048, 1, 4);
      for (int64_t p = 0; p < n_parts; ++p) {
        const int64_t a = box.i0 + rows * p / n_parts, b = box.i0 + rows * (p + 1) / n_parts;
        if (a >= b) continue;
        // Rows [a, b) meet keys in [j0', j1') within the box: shrink the key range to them.
        const Box sub = distributed::connect(plan.bounds, a, b, box.j0, box.j1);
        if (sub.empty()) continue;
        out.push_back({sub.i0, sub.i1, sub.j0, sub.j1, qs.local + (sub.i0 - qs.start),
                       ks.local + (sub.j0 - ks.start)});
      }
    }
  }
  return out;
}

// The options of one block call: the caller's, with positions and key lengths made local to the
// piece.
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

// Reads element e of a contiguous tensor as double.
template <class T>
struct Reader {
  const T* p;
  double operator()(int64_t e) const { return static_cast<double>(p[e]); }
};
struct AnyReader {
  const char* p;
  DType t;
  double operator()(int64_t e) const {
    return load_as_double(p + e * static_cast<int64_t>(dtype_size(t)), t);
  }
};
template <class Fn>
void with_reader(const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::f32) {
    fn(Reader<float>{t.data_as<float>()});
  } else if (t.dtype() == DType::f64) {
    fn(Reader<double>{t.data_as<double>()});
  } else {
    fn(AnyReader{static_cast<const char*>(t.data()), t.dtype()});
  }
}

// Merges one block's (out [BH, n, Dv], lse [BH, n]) into the running result of rows [row0, row0 +
// n).
void merge_rows(double* acc_out, double* acc_lse, int64_t rows_total, int64_t row0,
                const Tensor& out, const Tensor& lse, int64_t BH, int64_t n, int64_t Dv) {
  const Tensor oc = out.contiguous(), lc = lse.contiguous();
  with_reader(oc, [&](auto o) {
    with_reader(lc, [&](auto l) {
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

// acc[bh, row0 + i, :] += src[bh, i, :] for a contiguous src [BH, n, W]; acc has rows_total rows
// per bh.
template <class A>
void add_rows(A* acc, int64_t rows_total, int64_t row0, const Tensor& src, int64_t BH, int64_t n,
              int64_t W) {
  const Tensor sc = src.contiguous();
  with_reader(sc, [&](auto s) {
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t i = 0; i < n; ++i) {
        A* a = acc + (bh * rows_total + row0 + i) * W;
        const int64_t e = (bh * n + i) * W;
        for (int64_t d = 0; d < W; ++d) a[d] += static_cast<A>(s(e + d));
      }
    }
  });
}

// Writes a [BH, rows, W] array of double (or A) into a new tensor of `shape` and `dtype`.
template <class A>
Tensor to_tensor(const A* acc, const Shape& shape, DType dtype) {
  const int64_t n = checked_numel(shape, "attn::ring_attention");
  Tensor t = Tensor::empty(shape, dtype);
  if (dtype == DType::f32) {
    float* p = t.data_as<float>();
    for (int64_t e = 0; e < n; ++e) p[e] = static_cast<float>(acc[e]);
  } else if (dtype == DType::f64) {
    double* p = t.data_as<double>();
    for (int64_t e = 0; e < n; ++e) p[e] = static_cast<double>(acc[e]);
  } else {
    char* p = static_cast<char*>(t.data());
    const auto step = static_cast<int64_t>(dtype_size(dtype));
    for (int64_t e = 0; e < n; ++e)
      store_from_double(p + e * step, dtype, static_cast<double>(acc[e]));
  }
  return t;
}

// bf16 / f16 blocks are computed in f32 (the contract's accumulation type), so that a block's
// partial result is not rounded to 8 or 11 bits before the merge; K/V still travel in the input
// dtype. f32 and f64 pass as they are.
Tensor in_compute(const Tensor& t) {
  return t.dtype() == acc_dtype(t.dtype()) ? t : t.to(acc_dtype(t.dtype()));
}

[[noreturn]] void throw_collective(const std::string& agreed) {
  throw Error(fmt::format("{} (every rank stopped)", agreed));
}

std::string injected_failure(const char* fn, int t) {
  return fmt::format("{}: injected failure at ring step {} (attn::testing::ring_fail_at_step)", fn,
                     t);
}

}  // namespace

AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const AttentionOptions& o, MPI_Comm comm, RingLayout layout) {
  constexpr const char* fn = "attn::ring_attention";
  distributed::check_communicator(fn, comm);
  PrivateComm pc(comm);
  const int fail_step = testing::g_fail_step.exchange(-1);
  const Clock::time_point t_start = Clock::now();
  RingStats stats;
  const Setup st = collective_setup(fn, pc, q, k, v, o, layout);
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
    throw_collective(agreed);
  }

  const Tensor qc = in_compute(q);
  int cur = 0;
  for (int t = 0; t < P; ++t) {
    const int s = (r - t + P) % P, s_next = (r - t - 1 + 2 * P) % P;
    std::vector<MPI_Request> reqs;
    if (t + 1 <= plan.hops[s_next]) {
      distributed::irecv_bytes(buf[1 - cur].data(), block_bytes(st, s_next, st.dtype), pc.left(),
                               kTagKV, pc.get(), &reqs);
    }
    const bool holding = t <= plan.hops[s];
    if (holding && t + 1 <= plan.hops[s]) {
      distributed::isend_bytes(buf[cur].data(), block_bytes(st, s, st.dtype), pc.right(), kTagKV,
                               pc.get(), &reqs);
      stats.bytes_sent += static_cast<int64_t>(block_bytes(st, s, st.dtype));
    }
    // A rank that failed keeps passing blocks on (so nobody waits forever) but computes nothing
    // more.
    if (t == fail_step && error.empty()) error = injected_failure(fn, t);
    const Clock::time_point t_compute = Clock::now();
    if (holding && plan.need(r, s) && error.empty()) {
      ++stats.blocks_computed;
      try {
        auto [kb, vb] = block_views(st, buf[cur], s, st.dtype);
        for (const Piece& piece : pieces_of(plan, r, s)) {
          const int64_t n = piece.i1 - piece.i0, m = piece.j1 - piece.j0;
          const AttentionResult res =
              attention(qc.slice(-2, piece.q_local, piece.q_local + n),
                        in_compute(kb.slice(-2, piece.k_offset, piece.k_offset + m)),
                        in_compute(vb.slice(-2, piece.k_offset, piece.k_offset + m)),
                        piece_options(o, st, piece));
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
    stats.wait_ms += ms_since(t_wait);
    cur = 1 - cur;
  }
  stats.steps = P;
  if (const std::string agreed = distributed::agree_on_error(pc.get(), fn, error);
      !agreed.empty()) {
    throw_collective(agreed);
  }

  AttentionResult res;
  res.out = to_tensor(acc_out.data(), with_length(st.batch, st.Hq, Lr, st.Dv), st.dtype);
  Shape lse_shape = st.batch;
  lse_shape.insert(lse_shape.end(), {st.Hq, Lr});
  res.lse = to_tensor(acc_lse.data(), lse_shape, acc_dtype(st.dtype));
  stats.total_ms = ms_since(t_start);
  g_last_stats = stats;
  return res;
}

namespace {

// The backward's loop, with the accumulators' element type A (float, or double for f64 inputs).
template <class A>
AttentionGrads ring_backward_impl(const char* fn, const PrivateComm& pc, const Setup& st,
                                  const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& o, int fail_step, RingStats* stats) {
  const Plan& plan = st.plan;
  const int r = pc.rank(), P = pc.size();
  const int64_t Lr = plan.q_len[r];
  // dK/dV accumulators of block s: [BHkv, Lk_s, D] then [BHkv, Lk_s, Dv], element type A.
  auto acc_elems = [&](int s) { return st.BHkv * plan.k_len[s] * (st.D + st.Dv); };

  Buffer kv[2], dkv_out[2], dkv_in, home;
  std::vector<A> part;
  std::vector<double> dq;
  std::string error;
  try {
    size_t max_kv = 0, max_acc = 0;
    for (int s = 0; s < P; ++s) {
      max_kv = std::max(max_kv, block_bytes(st, s, st.dtype));
      max_acc = std::max(max_acc, static_cast<size_t>(acc_elems(s)) * sizeof(A));
    }
    for (Buffer* b : {&kv[0], &kv[1]}) b->reserve(max_kv);
    for (Buffer* b : {&dkv_out[0], &dkv_out[1], &dkv_in}) b->reserve(max_acc);
    home.reserve(static_cast<size_t>(acc_elems(r)) * sizeof(A));
    part.resize(max_acc / sizeof(A));
    dq.assign(static_cast<size_t>(st.BH * Lr * st.D), 0.0);
    auto [k0, v0] = block_views(st, kv[0], r, st.dtype);
    k0.copy_from(k);
    v0.copy_from(v);
  } catch (const std::exception& e) {
    error = fmt::format("{}: {}", fn, e.what());
  }
  if (const std::string agreed = distributed::agree_on_error(pc.get(), fn, error);
      !agreed.empty()) {
    throw_collective(agreed);
  }

  // My block's accumulators come home from the last rank that used it.
  std::vector<MPI_Request> home_req;
  const size_t my_acc_bytes = static_cast<size_t>(acc_elems(r)) * sizeof(A);
  if (plan.hops[r] > 0) {
    distributed::irecv_bytes(home.data(), my_acc_bytes, (r + plan.hops[r]) % P, kTagHome, pc.get(),
                             &home_req);
  }

  std::vector<MPI_Request>
      dkv_sent;  // the accumulator sent at the previous step (overlaps this step)
  const Tensor qc = in_compute(q), doutc = in_compute(dout), outc = in_compute(out);
  int cur = 0;
  for (int t = 0; t < P; ++t) {
    const int s = (r - t + P) % P, s_next = (r - t - 1 + 2 * P) % P;
    const bool holding = t <= plan.hops[s];
    std::vector<MPI_Request> reqs, dkv_recv;
    if (t + 1 <= plan.hops[s_next]) {
      distributed::irecv_bytes(kv[1 - cur].data(), block_bytes(st, s_next, st.dtype), pc.left(),
                               kTagKV, pc.get(), &reqs);
    }
    if (holding && t + 1 <= plan.hops[s]) {
      distributed::isend_bytes(kv[cur].data(), block_bytes(st, s, st.dtype), pc.right(), kTagKV,
                               pc.get(), &reqs);
      stats->bytes_sent += static_cast<int64_t>(block_bytes(st, s, st.dtype));
    }
    // The accumulator of block s, from the rank that used it one step ago.
    const bool acc_arrives = holding && t >= 1;
    const size_t acc_bytes = static_cast<size_t>(acc_elems(s)) * sizeof(A);
    if (acc_arrives)
      distributed::irecv_bytes(dkv_in.data(), acc_bytes, pc.left(), kTagDKV, pc.get(), &dkv_recv);

    bool touched = false;
    if (t == fail_step && error.empty()) error = injected_failure(fn, t);
    const Clock::time_point t_compute = Clock::now();
    if (holding && plan.need(r, s) && error.empty()) {
      ++stats->blocks_computed;
      try {
        std::fill(part.begin(), part.begin() + acc_elems(s), A(0));
        A* part_k = part.data();
        A* part_v = part.data() + st.BHkv * plan.k_len[s] * st.D;
        auto [kb, vb] = block_views(st, kv[cur], s, st.dtype);
        for (const Piece& piece : pieces_of(plan, r, s)) {
          const int64_t n = piece.i1 - piece.i0, m = piece.j1 - piece.j0;
          const int64_t a = piece.q_local, c = piece.k_offset;
          const AttentionGrads g = attention_backward(
              doutc.slice(-2, a, a + n), qc.slice(-2, a, a + n), in_compute(kb.slice(-2, c, c + m)),
              in_compute(vb.slice(-2, c, c + m)), outc.slice(-2, a, a + n), lse.slice(-1, a, a + n),
              piece_options(o, st, piece));
          add_rows(dq.data(), Lr, a, g.dq, st.BH, n, st.D);
          add_rows(part_k, plan.k_len[s], c, g.dk, st.BHkv, m, st.D);
          add_rows(part_v, plan.k_len[s], c, g.dv, st.BHkv, m, st.Dv);
          distributed::poke(&reqs);
          distributed::poke(&dkv_sent);
        }
        touched = true;
      } catch (const std::exception& e) {
        error = fmt::format("{}: {}", fn, e.what());
      }
    }

    Clock::time_point t_wait = Clock::now();
    stats->compute_ms += std::chrono::duration<double, std::milli>(t_wait - t_compute).count();
    if (holding) {
      // acc(s) = what arrived + my part, into the out buffer not in flight.
      distributed::wait_all(&dkv_recv);
      distributed::wait_all(&dkv_sent);
      stats->wait_ms += ms_since(t_wait);
      Buffer& ob = dkv_out[t % 2];
      A* acc = reinterpret_cast<A*>(ob.data());
      const int64_t ne = acc_elems(s);
      if (acc_arrives) {
        std::memcpy(acc, dkv_in.data(), acc_bytes);
      } else {
        std::fill(acc, acc + ne, A(0));
      }
      if (touched) {
        for (int64_t e = 0; e < ne; ++e) acc[e] += part[e];
      }
      if (s != r || t + 1 <= plan.hops[s]) stats->bytes_sent += static_cast<int64_t>(acc_bytes);
      if (t + 1 <= plan.hops[s]) {
        distributed::isend_bytes(acc, acc_bytes, pc.right(), kTagDKV, pc.get(), &dkv_sent);
      } else if (s != r) {
        distributed::isend_bytes(acc, acc_bytes, s, kTagHome, pc.get(), &dkv_sent);
      } else {
        std::memcpy(home.data(), acc, acc_bytes);  // my block went nowhere: its sum is complete
      }
    }
    t_wait = Clock::now();
    distributed::wait_all(&reqs);
    stats->wait_ms += ms_since(t_wait);
    cur = 1 - cur;
  }
  const Clock::time_point t_wait = Clock::now();
  distributed::wait_all(&dkv_sent);
  distributed::wait_all(&home_req);
  stats->wait_ms += ms_since(t_wait);
  stats->steps = P;
  if (const std::string agreed = distributed::agree_on_error(pc.get(), fn, error);
      !agreed.empty()) {
    throw_collective(agreed);
  }

  AttentionGrads g;
  g.dq = to_tensor(dq.data(), q.shape(), st.dtype);
  const A* h = reinterpret_cast<const A*>(home.data());
  g.dk = to_tensor(h, k.shape(), st.dtype);
  g.dv = to_tensor(h + st.BHkv * plan.k_len[r] * st.D, v.shape(), st.dtype);
  return g;
}

}  // namespace

AttentionGrads ring_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       const AttentionOptions& o, MPI_Comm comm,
                                       RingLayout layout) {
  constexpr const char* fn = "attn::ring_attention_backward";
  distributed::check_communicator(fn, comm);
  PrivateComm pc(comm);
  const int fail_step = testing::g_fail_step.exchange(-1);
  const Clock::time_point t_start = Clock::now();
  RingStats stats;
  const Setup st = collective_setup(fn, pc, q, k, v, o, layout, &dout, &out, &lse);
  AttentionGrads g =
      st.dtype == DType::f64
          ? ring_backward_impl<double>(fn, pc, st, dout, q, k, v, out, lse, o, fail_step, &stats)
          : ring_backward_impl<float>(fn, pc, st, dout, q, k, v, out, lse, o, fail_step, &stats);
  stats.total_ms = ms_since(t_start);
  g_last_stats = stats;
  return g;
}

}  // namespace attn
