// The packed variable-length entries (attn/varlen.h): validate the packed tensors and the offsets
// before any read, build one problem per sequence whose tensors are views of the packed rows (heads
// strided: [1, H, L_b, D] with strides (-, D, H * D, 1)), and run the sequences on the one backend
// chosen for the call: a sequence with a large share of the work alone on every thread, the others
// at one thread each, longest first, in one parallel loop. Each sequence's result is the same bits
// for any thread count (core/parallel.h), so the packed result is too.
#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "attn/varlen.h"
#include "backend_run.h"
#include "contract/validate.h"
#include "core/fail.h"
#include "core/parallel.h"

namespace attn {

namespace {

using contract::BackwardProblem;
using contract::ForwardProblem;
using detail::fail;

// The validated call: offsets, and one problem per sequence (outputs not yet set).
struct Packed {
  int64_t B = 0, total_q = 0, total_k = 0;
  std::vector<int64_t> cu_q, cu_k;
  std::vector<ForwardProblem> seqs;
  Backend backend = Backend::reference;
  bool drops_all = false;  // dropout_p == 1 (contract::Validated::drops_all)
  int threads = 0;
};

// q, k, v: floating, one dtype, [total, heads, dim], whole query groups per kv head, one D for q
// and k, one total and head count for k and v.
void check_packed_qkv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  contract::check_float(fn, "q", q);
  contract::check_float(fn, "k", k);
  contract::check_float(fn, "v", v);
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail(fn, fmt::format("q, k and v must share one dtype, got q {} {}, k {} {}, v {} {}",
                         dtype_name(q.dtype()), q.shape_str(), dtype_name(k.dtype()), k.shape_str(),
                         dtype_name(v.dtype()), v.shape_str()));
  }
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3) {
    fail(fn, fmt::format("q, k and v must be packed [total, heads, dim], got q {}, k {}, v {}",
                         q.shape_str(), k.shape_str(), v.shape_str()));
  }
  const bool ok = k.size(1) > 0 && q.size(1) % k.size(1) == 0 && q.size(2) == k.size(2) &&
                  k.size(0) == v.size(0) && k.size(1) == v.size(1);
  if (!ok) {
    fail(fn,
         fmt::format("q {}, k {}, v {}: need Hq a multiple of Hkv > 0, one head dim for q and k, "
                     "one total and head count for k and v",
                     q.shape_str(), k.shape_str(), v.shape_str()));
  }
}

// Options that take another form in a packed batch, refused by name.
void refuse_unpacked_options(const char* fn, const AttentionOptions& o) {
  if (o.key_lengths.defined()) {
    fail(fn, fmt::format("key_lengths ({}) is not taken by the varlen entries: use "
                         "VarlenBatch::seqused_k",
                         o.key_lengths.shape_str()));
  }
  if (o.mask.defined())
    fail(fn,
         fmt::format("dense masks ({}) are not supported on a packed batch", o.mask.shape_str()));
  if (o.block_layout.layout.defined())
    fail(fn, "block layouts are not supported on a packed batch");
  if (o.return_weights) fail(fn, "return_weights is not supported on a packed batch");
  if (o.mask_grad) fail(fn, "mask_grad is not supported on a packed batch (no dense masks)");
}

// cu_seqlens_x: int32 [B + 1], starting at 0, non-decreasing, ending at the packed length `total`
// of `tensor` (named for the message).
std::vector<int64_t> read_offsets(const char* fn, const char* name, const Tensor& cu, int64_t total,
                                  const char* tensor, const Tensor& t) {
  if (!cu.defined() || cu.dtype() != DType::i32 || cu.dim() != 1 || cu.size(0) < 1) {
    fail(fn, fmt::format("{} must be int32 [B + 1], got {}", name,
                         cu.defined() ? fmt::format("{} with shape {}", dtype_name(cu.dtype()),
                                                    cu.shape_str())
                                      : std::string("nothing")));
  }
  const std::vector<double> vals = cu.to_vector();
  std::vector<int64_t> off(vals.begin(), vals.end());
  if (off[0] != 0) fail(fn, fmt::format("{}[0] = {}, must be 0", name, off[0]));
  for (size_t b = 1; b < off.size(); ++b) {
    if (off[b] < off[b - 1]) {
      fail(fn, fmt::format("{}[{}] = {} is below {}[{}] = {} (offsets must not decrease)", name, b,
                           off[b], name, b - 1, off[b - 1]));
    }
  }
  if (off.back() != total) {
    fail(fn, fmt::format("{}[B = {}] = {} must equal the packed length of {} {}", name,
                         off.size() - 1, off.back(), tensor, t.shape_str()));
  }
  return off;
}

// seqused_k: int32 [B], each in [0, Lk_b]. Empty when not given.
std::vector<int64_t> read_used(const char* fn, const VarlenBatch& vb,
                               const std::vector<int64_t>& cu_k) {
  if (!vb.seqused_k.defined()) return {};
  const int64_t B = static_cast<int64_t>(cu_k.size()) - 1;
  const Tensor& u = vb.seqused_k;
  if (u.dtype() != DType::i32 || u.dim() != 1 || u.size(0) != B) {
    fail(fn, fmt::format("seqused_k must be int32 [B = {}], got {} with shape {}", B,
                         dtype_name(u.dtype()), u.shape_str()));
  }
  const std::vector<double> vals = u.to_vector();
  std::vector<int64_t> used(vals.begin(), vals.end());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lk = cu_k[b + 1] - cu_k[b];
    if (used[b] < 0 || used[b] > lk) {
      fail(fn, fmt::format("seqused_k[{}] = {} is outside [0, {}] (sequence {} has keys {}..{})", b,
                           used[b], lk, b, cu_k[b], cu_k[b + 1]));
    }
  }
  return used;
}

// max_seqlen_x: -1 (not given) or a bound no sequence exceeds.
void check_max_seqlen(const char* fn, const char* name, int64_t bound,
                      const std::vector<int64_t>& cu) {
  if (bound < -1) fail(fn, fmt::format("{} must be -1 (not given) or >= 0, got {}", name, bound));
  if (bound < 0) return;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] - cu[b] > bound) {
      fail(fn,
           fmt::format("{} = {} but sequence {} has length {}", name, bound, b, cu[b + 1] - cu[b]));
    }
  }
}

// ALiBi slopes [Hq] or [B, Hq], finite: the row of each sequence.
std::vector<std::vector<double>> read_alibi(const char* fn, const AttentionOptions& o, int64_t B,
                                            int64_t Hq) {
  if (!o.alibi_slopes.defined()) return {};
  const Tensor& a = o.alibi_slopes;
  const bool per_seq = a.dim() == 2 && a.size(0) == B && a.size(1) == Hq;
  if (!is_floating(a.dtype()) || !(per_seq || (a.dim() == 1 && a.size(0) == Hq))) {
    fail(fn, fmt::format("alibi_slopes must be floating [Hq = {}] or [B = {}, Hq], got {} with "
                         "shape {}",
                         Hq, B, dtype_name(a.dtype()), a.shape_str()));
  }
  const std::vector<double> vals = a.to_vector();
  for (size_t e = 0; e < vals.size(); ++e) {
    if (!std::isfinite(vals[e]))
      fail(fn, fmt::format("alibi_slopes (flat index {}) = {} is not finite", e, vals[e]));
  }
  std::vector<std::vector<double>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto first = vals.begin() + (per_seq ? b * Hq : 0);
    rows[b].assign(first, first + Hq);
  }
  return rows;
}

// Rows [r0, r1) of a packed [total, H, X] tensor as the 4-D view [1, H, r1 - r0, X].
Tensor sequence_view(const Tensor& t, int64_t r0, int64_t r1) {
  return t.slice(0, r0, r1).permute({1, 0, 2}).unsqueeze(0);
}

// Columns [c0, c1) of lse [H, total] as the 3-D view [1, H, c1 - c0].
Tensor lse_view(const Tensor& lse, int64_t c0, int64_t c1) {
  return lse.slice(1, c0, c1).unsqueeze(0);
}

// Every check before any read of the packed data, then one problem per sequence (views of q, k, v).
Packed validate_packed(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                       const VarlenBatch& vb, const AttentionOptions& o) {
  contract::check_enum(fn, "backend", o.backend);
  contract::check_enum(fn, "align", o.align);
  check_packed_qkv(fn, q, k, v);
  refuse_unpacked_options(fn, o);
  Packed pk;
  pk.total_q = q.size(0), pk.total_k = k.size(0);
  pk.cu_q = read_offsets(fn, "cu_seqlens_q", vb.cu_seqlens_q, pk.total_q, "q", q);
  pk.cu_k = read_offsets(fn, "cu_seqlens_k", vb.cu_seqlens_k, pk.total_k, "k", k);
  if (pk.cu_q.size() != pk.cu_k.size()) {
    fail(fn, fmt::format("cu_seqlens_q {} and cu_seqlens_k {} must both be [B + 1]",
                         vb.cu_seqlens_q.shape_str(), vb.cu_seqlens_k.shape_str()));
  }
  pk.B = static_cast<int64_t>(pk.cu_q.size()) - 1;
  const std::vector<int64_t> used = read_used(fn, vb, pk.cu_k);
  check_max_seqlen(fn, "max_seqlen_q", vb.max_seqlen_q, pk.cu_q);
  check_max_seqlen(fn, "max_seqlen_k", vb.max_seqlen_k, pk.cu_k);
  contract::check_scalars(fn, o);

  ForwardProblem base;
  base.B = 1, base.Hq = q.size(1), base.Hkv = k.size(1), base.D = q.size(2), base.Dv = v.size(2);
  base.group = base.Hq / base.Hkv;
  base.dtype = q.dtype();
  contract::resolve_scores(o, base);
  contract::check_sinks(fn, o, base);
  const std::vector<std::vector<double>> alibi = read_alibi(fn, o, pk.B, base.Hq);
  pk.drops_all = o.dropout_p == 1.0;
  base.dropout.p = pk.drops_all ? 0.0 : o.dropout_p;
  base.dropout.seed = o.seed;
  if (!alibi.empty()) base.alibi = alibi[0];
  pk.backend = contract::backend_for(fn, o.backend, base);

  double work = 0.0;
  for (int64_t b = 0; b < pk.B; ++b) {
    ForwardProblem p = base;
    p.Lq = pk.cu_q[b + 1] - pk.cu_q[b], p.Lk = pk.cu_k[b + 1] - pk.cu_k[b];
    contract::check_position_rule(fn, o, p);
    if (!used.empty() && used[b] < p.Lk) p.key_length = {used[b]};
    if (!alibi.empty()) p.alibi = alibi[b];
    p.dropout.batch_base = b;
    p.q = sequence_view(q, pk.cu_q[b], pk.cu_q[b + 1]);
    p.k = sequence_view(k, pk.cu_k[b], pk.cu_k[b + 1]);
    p.v = sequence_view(v, pk.cu_k[b], pk.cu_k[b + 1]);
    work += static_cast<double>(p.Hq) * p.Lq * p.key_length_of(0) * (p.D + p.Dv);
    pk.seqs.push_back(std::move(p));
  }
  pk.threads = o.threads > 0 ? o.threads : threads_for_work(work);
  return pk;
}

// Runs fn(b, threads) for every sequence with rows: a sequence with more than 1 / threads of the
// work alone with every thread (first), the others at one thread each, longest first, in one
// parallel loop that hands them out as threads free up.
template <class Fn>
void for_each_sequence(const Packed& pk, Fn&& fn) {
  const int threads = resolve_threads(pk.threads);
  std::vector<double> work(static_cast<size_t>(pk.B));
  double total = 0.0;
  for (int64_t b = 0; b < pk.B; ++b) {
    const ForwardProblem& p = pk.seqs[b];
    work[b] = static_cast<double>(p.Lq) * std::max<int64_t>(p.key_length_of(0), 1);
    total += work[b];
  }
  std::vector<int64_t> alone, shared;
  for (int64_t b = 0; b < pk.B; ++b) {
    if (pk.seqs[b].Lq == 0) continue;
    (threads > 1 && work[b] * threads > total ? alone : shared).push_back(b);
  }
  for (int64_t b : alone) fn(b, threads);
  std::stable_sort(shared.begin(), shared.end(),
                   [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  parallel_for(static_cast<int64_t>(shared.size()), threads,
               [&](int64_t task, int) { fn(shared[task], 1); });
}

// dout and out [total_q, Hq, Dv], lse [Hq, total_q], floating; converted to the problem's dtypes.
void check_backward_inputs(const char* fn, const Packed& pk, const Tensor& q, const Tensor& v,
                           Tensor* dout, Tensor* out, Tensor* lse) {
  contract::check_float(fn, "dout", *dout);
  contract::check_float(fn, "out", *out);
  contract::check_float(fn, "lse", *lse);
  const Shape out_shape{pk.total_q, q.size(1), v.size(2)}, lse_shape{q.size(1), pk.total_q};
  if (dout->shape() != out_shape || out->shape() != out_shape) {
    fail(fn, fmt::format("dout and out must have the output's shape {}, got dout {} and out {}",
                         shape_to_string(out_shape), dout->shape_str(), out->shape_str()));
  }
  if (lse->shape() != lse_shape) {
    fail(fn, fmt::format("lse must have shape {} ([Hq, total_q]), got {}",
                         shape_to_string(lse_shape), lse->shape_str()));
  }
  const DType ld = contract::lse_dtype(q.dtype());
  if (dout->dtype() != q.dtype()) *dout = dout->to(q.dtype());
  if (out->dtype() != q.dtype()) *out = out->to(q.dtype());
  if (lse->dtype() != ld) *lse = lse->to(ld);
}

}  // namespace

AttentionResult attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const VarlenBatch& vb, const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention_varlen";
  Packed pk = validate_packed(fn, q, k, v, vb, o);
  AttentionResult res;
  res.out = Tensor::empty({pk.total_q, q.size(1), v.size(2)}, q.dtype());
  res.lse = Tensor::empty({q.size(1), pk.total_q}, contract::lse_dtype(q.dtype()));
  for_each_sequence(pk, [&](int64_t b, int threads) {
    ForwardProblem& p = pk.seqs[b];
    p.out = sequence_view(res.out, pk.cu_q[b], pk.cu_q[b + 1]);
    p.lse = lse_view(res.lse, pk.cu_q[b], pk.cu_q[b + 1]);
    p.threads = threads;
    detail::run_forward(pk.backend, p);
  });
  if (pk.drops_all) res.out.fill(0.0);
  return res;
} catch (const std::bad_alloc&) {
  throw Error(fmt::format("attn::attention_varlen: out of memory for q {}, k {}, v {}",
                          q.shape_str(), k.shape_str(), v.shape_str()));
}

AttentionGrads attention_varlen_backward(const Tensor& dout_in, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out_in,
                                         const Tensor& lse_in, const VarlenBatch& vb,
                                         const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention_varlen_backward";
  Packed pk = validate_packed(fn, q, k, v, vb, o);
  Tensor dout = dout_in, out = out_in, lse = lse_in;
  check_backward_inputs(fn, pk, q, v, &dout, &out, &lse);
  AttentionGrads g;
  g.dq = Tensor::zeros(q.shape(), q.dtype());
  g.dk = Tensor::zeros(k.shape(), q.dtype());
  g.dv = Tensor::zeros(v.shape(), q.dtype());
  std::vector<std::vector<double>> dsinks(static_cast<size_t>(pk.B));
  if (!pk.drops_all) {
    for_each_sequence(pk, [&](int64_t b, int threads) {
      BackwardProblem p;
      static_cast<ForwardProblem&>(p) = pk.seqs[b];
      const int64_t q0 = pk.cu_q[b], q1 = pk.cu_q[b + 1], k0 = pk.cu_k[b], k1 = pk.cu_k[b + 1];
      p.dout = sequence_view(dout, q0, q1);
      p.out = sequence_view(out, q0, q1);
      p.lse = lse_view(lse, q0, q1);
      p.dq = sequence_view(g.dq, q0, q1);
      p.dk = sequence_view(g.dk, k0, k1);
      p.dv = sequence_view(g.dv, k0, k1);
      p.threads = threads;
      dsinks[b] = detail::run_backward(pk.backend, p);
    });
  }
  if (o.sinks.defined()) {
    // Summed over the sequences in order: the same bits for any thread count.
    std::vector<double> sum(static_cast<size_t>(q.size(1)), 0.0);
    for (const std::vector<double>& part : dsinks) {
      for (size_t h = 0; h < part.size(); ++h) sum[h] += part[h];
    }
    g.dsinks = Tensor::from_vector({q.size(1)}, sum, o.sinks.dtype());
  }
  return g;
} catch (const std::bad_alloc&) {
  throw Error(fmt::format("attn::attention_varlen_backward: out of memory for q {}, k {}, v {}",
                          q.shape_str(), k.shape_str(), v.shape_str()));
}

}  // namespace attn
