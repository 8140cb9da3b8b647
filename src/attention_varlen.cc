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
#include "contract/packed.h"
#include "contract/validate.h"
#include "core/fail.h"
#include "core/parallel.h"

namespace attn {

namespace {

using contract::BackwardProblem;
using contract::for_each_sequence;
using contract::ForwardProblem;
using contract::lse_view;
using contract::Packed;
using contract::sequence_view;
using detail::fail;

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

// Every check before any read of the packed data, then one problem per sequence (views of q, k, v).
Packed validate_packed(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                       const VarlenBatch& vb, const AttentionOptions& o) {
  contract::check_enum(fn, "backend", o.backend);
  contract::check_enum(fn, "align", o.align);
  check_packed_qkv(fn, q, k, v);
  contract::refuse_unpacked_options(fn, o);
  Packed pk;
  pk.total_q = q.size(0), pk.total_k = k.size(0);
  pk.cu_q = contract::read_offsets(fn, "cu_seqlens_q", vb.cu_seqlens_q, pk.total_q, "q", q);
  pk.cu_k = contract::read_offsets(fn, "cu_seqlens_k", vb.cu_seqlens_k, pk.total_k, "k", k);
  if (pk.cu_q.size() != pk.cu_k.size()) {
    fail(fn, fmt::format("cu_seqlens_q {} and cu_seqlens_k {} must both be [B + 1]",
                         vb.cu_seqlens_q.shape_str(), vb.cu_seqlens_k.shape_str()));
  }
  pk.B = static_cast<int64_t>(pk.cu_q.size()) - 1;
  const std::vector<int64_t> used = read_used(fn, vb, pk.cu_k);
  contract::check_max_seqlen(fn, "max_seqlen_q", vb.max_seqlen_q, pk.cu_q);
  contract::check_max_seqlen(fn, "max_seqlen_k", vb.max_seqlen_k, pk.cu_k);
  contract::SequenceShapes shapes{q.size(1), k.size(1), q.size(2), v.size(2), q.dtype()};
  contract::build_sequences(fn, o, shapes, used, pk);
  for (int64_t b = 0; b < pk.B; ++b) {
    ForwardProblem& p = pk.seqs[b];
    p.q = sequence_view(q, pk.cu_q[b], pk.cu_q[b + 1]);
    p.k = sequence_view(k, pk.cu_k[b], pk.cu_k[b + 1]);
    p.v = sequence_view(v, pk.cu_k[b], pk.cu_k[b + 1]);
  }
  return pk;
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

AttentionResult attention_varlen(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 const VarlenBatch& vb, const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention_varlen";
  const Tensor q = contract::unit_stride_rows(q_in), k = contract::unit_stride_rows(k_in),
               v = contract::unit_stride_rows(v_in);
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
                          q_in.shape_str(), k_in.shape_str(), v_in.shape_str()));
}

AttentionGrads attention_varlen_backward(const Tensor& dout_in, const Tensor& q_in,
                                         const Tensor& k_in, const Tensor& v_in,
                                         const Tensor& out_in, const Tensor& lse_in,
                                         const VarlenBatch& vb, const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention_varlen_backward";
  const Tensor q = contract::unit_stride_rows(q_in), k = contract::unit_stride_rows(k_in),
               v = contract::unit_stride_rows(v_in);
  Packed pk = validate_packed(fn, q, k, v, vb, o);
  Tensor dout = dout_in, out = out_in, lse = lse_in;
  check_backward_inputs(fn, pk, q, v, &dout, &out, &lse);
  // (an expanded dout, as out.sum().backward() gives, has stride 0 everywhere)
  dout = contract::unit_stride_rows(dout), out = contract::unit_stride_rows(out);
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
                          q_in.shape_str(), k_in.shape_str(), v_in.shape_str()));
}

}  // namespace attn
