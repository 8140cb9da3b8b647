// attn::linear_attention / linear_attention_backward (include/attn/linear_attention.h): validate once
// into a contract::LinearProblem (the shape rules shared with attn::attention), then run the backend
// (the reference's recurrence in double: src/backends/reference/linear_attention_ref.cc).
#include "attn/linear_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/reference/attention_ref.h"
#include "contract/options.h"
#include "contract/problem.h"
#include "core/fail.h"
#include "core/parallel.h"

namespace attn {

namespace {

using detail::fail;

using Problem = contract::LinearProblem;

// Linear attention's own rules (f32 or f64, exactly 4-D, one dtype), then the shape rules every
// variant shares (contract::check_qkv_shapes).
void check_qkv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  for (auto [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (!t->defined()) fail(fn, fmt::format("{} is undefined", name));
    if (t->dtype() != DType::f32 && t->dtype() != DType::f64) {
      fail(fn, fmt::format("{} must be f32 or f64, got {} with shape {}", name,
                           dtype_name(t->dtype()), t->shape_str()));
    }
    if (t->dim() != 4) {
      fail(fn, fmt::format("{} must be 4-D [B, heads, length, dim], got shape {}", name,
                           t->shape_str()));
    }
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail(fn, fmt::format("q, k and v must share one dtype, got q {} {}, k {} {}, v {} {}",
                         dtype_name(q.dtype()), q.shape_str(), dtype_name(k.dtype()), k.shape_str(),
                         dtype_name(v.dtype()), v.shape_str()));
  }
  if (const std::string problem = contract::check_qkv_shapes(q, k, v); !problem.empty()) {
    fail(fn, problem);
  }
}

// key_lengths [B] and key_keep [B, Lk] into p.keep (left empty when neither is given).
void check_padding(const char* fn, const LinearAttentionOptions& o, Problem& p) {
  if (o.key_lengths.defined()) {
    std::vector<int64_t> lengths;
    const std::string problem =
        contract::check_key_lengths(o.key_lengths, Shape{p.B}, p.B, p.Lk, &lengths);
    if (!problem.empty()) fail(fn, problem);
    p.keep.assign(static_cast<size_t>(p.B * p.Lk), 1);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t j = lengths[b]; j < p.Lk; ++j) p.keep[b * p.Lk + j] = 0;
  }
  if (o.key_keep.defined()) {
    const Tensor& m = o.key_keep;
    if (m.dtype() != DType::boolean || m.dim() != 2 || m.size(0) != p.B || m.size(1) != p.Lk) {
      fail(fn, fmt::format("key_keep must be bool [B = {}, Lk = {}], got {} with shape {}", p.B,
                           p.Lk, dtype_name(m.dtype()), m.shape_str()));
    }
    const std::vector<double> keep = m.to_vector();
    if (p.keep.empty()) p.keep.assign(keep.size(), 1);
    for (size_t e = 0; e < keep.size(); ++e) p.keep[e] = p.keep[e] && keep[e] != 0.0;
  }
}

Problem validate(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                 const LinearAttentionOptions& o) {
  check_qkv(fn, q, k, v);
  Problem p;
  p.B = q.size(0), p.Hq = q.size(1), p.Hkv = k.size(1), p.Lq = q.size(2), p.Lk = k.size(2);
  p.D = q.size(3), p.Dv = v.size(3);
  p.group = p.Hkv > 0 ? p.Hq / p.Hkv : 1;
  checked_numel(q.shape(), fn);
  checked_numel(k.shape(), fn);
  checked_numel(v.shape(), fn);
  checked_numel({p.B, p.Hq, p.Lq, p.Dv}, fn);
  p.causal = o.causal;
  p.offset = o.align == Align::bottom_right ? p.Lk - p.Lq : 0;
  check_padding(fn, o, p);
  const double work = static_cast<double>(p.B) * static_cast<double>(p.Hq) *
                      static_cast<double>(p.Lq + p.Lk) * static_cast<double>(p.D) *
                      static_cast<double>(p.Dv);
  p.threads = o.threads > 0 ? o.threads : threads_for_work(work);  // as attn::attention
  p.q = q.contiguous();
  p.k = k.contiguous();
  p.v = v.contiguous();
  return p;
}

}  // namespace

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const LinearAttentionOptions& options) {
  const Problem p = validate("attn::linear_attention", q, k, v, options);
  Tensor out = Tensor::empty({p.B, p.Hq, p.Lq, p.Dv}, q.dtype());
  reference::linear_forward(p, out);
  return out;
}

LinearAttentionGrads linear_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v,
                                               const LinearAttentionOptions& options) {
  constexpr const char* fn = "attn::linear_attention_backward";
  contract::LinearBackwardProblem p;
  static_cast<Problem&>(p) = validate(fn, q, k, v, options);
  const Shape out_shape{p.B, p.Hq, p.Lq, p.Dv};
  if (!dout.defined() || dout.dtype() != q.dtype() || dout.shape() != out_shape) {
    fail(fn, fmt::format("dout must be {} {} (the output's dtype and shape), got {}",
                         dtype_name(q.dtype()), shape_to_string(out_shape),
                         dout.defined()
                             ? fmt::format("{} {}", dtype_name(dout.dtype()), dout.shape_str())
                             : "undefined"));
  }
  p.dout = dout.contiguous();
  p.dq = Tensor::zeros(q.shape(), q.dtype());
  p.dk = Tensor::zeros(k.shape(), q.dtype());
  p.dv = Tensor::zeros(v.shape(), q.dtype());
  reference::linear_backward(p);
  return {p.dq, p.dk, p.dv};
}

}  // namespace attn
