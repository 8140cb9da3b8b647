// The entry points: validate once, canonicalise to 4-D views, pick the backend once, run it.
#include "attn/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <stdexcept>
#include <vector>

#include "attn/options.h"
#include "backend_run.h"
#include "backends/cpu/attention_cpu.h"
#include "backends/reference/attention_ref.h"
#include "contract/problem.h"
#include "contract/validate.h"
#include "core/fail.h"
#include "core/parallel.h"

namespace attn {

using contract::backend_for;
using contract::BackwardProblem;
using contract::check_float;
using contract::ForwardProblem;
using contract::lse_dtype;
using contract::merge_batch;
using contract::Validated;
using detail::fail;

namespace detail {
void throw_unknown_name(const char* parser, const char* what, std::string_view text,
                        const std::string& choices) {
  throw Error(fmt::format("{}: unknown {} '{}' (expected {})", parser, what, text, choices));
}
}  // namespace detail

const OptionInfo& option_info(std::string_view name) {
  for (const OptionInfo& info : kOptionInfo) {
    if (name == info.name) return info;
  }
  throw Error(fmt::format("attn::option_info: '{}' is not an attention option", name));
}

Backend parse_backend(const std::string& name) {
  return parse_enum<Backend>(name);
}
Align parse_align(const std::string& name) {
  return parse_enum<Align>(name);
}
MaskType parse_mask_type(const std::string& name) {
  return parse_enum<MaskType>(name);
}
const char* backend_name(Backend b) {
  return enum_name(b);
}
const char* align_name(Align a) {
  return enum_name(a);
}
const char* mask_type_name(MaskType m) {
  return enum_name(m);
}

Backend resolve_backend(Backend requested, DType dtype) {
  if (requested == Backend::automatic)
    return cpu::supports(dtype) ? Backend::cpu : Backend::reference;
  return requested;
}

// Both entry points are function-try-blocks: an allocation that fails anywhere below them (outputs, copies
// of broadcast options, backend scratch) surfaces as attn::Error, never as std::bad_alloc.
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention";
  Validated r = contract::validate(fn, q, k, v, o);
  ForwardProblem& p = r.p;
  const Backend backend = backend_for(fn, o.backend, p);
  AttentionResult res;
  res.out = Tensor::empty(r.out_shape, p.dtype);
  res.lse = Tensor::empty(r.lse_shape, lse_dtype(p.dtype));
  p.out = res.out.view({p.B, p.Hq, p.Lq, p.Dv});
  p.lse = res.lse.view({p.B, p.Hq, p.Lq});
  if (o.return_weights) {
    Shape ws = r.batch;
    ws.insert(ws.end(), {p.Hq, p.Lq, p.Lk});
    res.weights = Tensor::empty(ws, p.dtype);
    p.weights = res.weights.view({p.B, p.Hq, p.Lq, p.Lk});
  }
  detail::run_forward(backend, p);
  if (r.drops_all) res.out.fill(0.0);
  return res;
} catch (const std::bad_alloc&) {
  throw Error(fmt::format("attn::attention: out of memory for q {}, k {}, v {}", q.shape_str(),
                          k.shape_str(), v.shape_str()));
} catch (const std::length_error&) {
  throw Error(fmt::format("attn::attention: sizes too large for q {}, k {}, v {}", q.shape_str(),
                          k.shape_str(), v.shape_str()));
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& o, const Tensor& dweights) try {
  constexpr const char* fn = "attn::attention_backward";
  Validated r = contract::validate(fn, q, k, v, o);
  BackwardProblem p;
  static_cast<ForwardProblem&>(p) = std::move(r.p);
  check_float(fn, "dout", dout);
  check_float(fn, "out", out);
  check_float(fn, "lse", lse);
  if (dout.shape() != r.out_shape || out.shape() != r.out_shape) {
    fail(fn, fmt::format("dout and out must have the output's shape {}, got dout {} and out {}",
                         shape_to_string(r.out_shape), dout.shape_str(), out.shape_str()));
  }
  if (lse.shape() != r.lse_shape) {
    fail(fn, fmt::format("lse must have shape {} ([..., Hq, Lq]), got {}",
                         shape_to_string(r.lse_shape), lse.shape_str()));
  }
  if (o.mask_grad && !(o.mask.defined() && o.mask_type == MaskType::add)) {
    fail(fn, "mask_grad needs a mask of type 'add'");
  }
  const int nb = static_cast<int>(r.batch.size());
  if (dweights.defined()) p.dweights = contract::checked_dweights(fn, dweights, r, nb);
  // dL/dweights: the reference backend computes it (attention.h); none of the cpu kernels does.
  const Backend backend = dweights.defined() ? Backend::reference : backend_for(fn, o.backend, p);
  p.dout = merge_batch(dout.dtype() == p.dtype ? dout : dout.to(p.dtype), nb);
  p.out = merge_batch(out.dtype() == p.dtype ? out : out.to(p.dtype), nb);
  const DType ld = lse_dtype(p.dtype);
  Tensor lse_c = (lse.dtype() == ld ? lse : lse.to(ld));
  p.lse = merge_batch(lse_c.unsqueeze(-1), nb).select(3, 0);

  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), p.dtype);
  g.dk = Tensor::empty(k.shape(), p.dtype);
  g.dv = Tensor::empty(v.shape(), p.dtype);
  p.dq = g.dq.view({p.B, p.Hq, p.Lq, p.D});
  p.dk = g.dk.view({p.B, p.Hkv, p.Lk, p.D});
  p.dv = g.dv.view({p.B, p.Hkv, p.Lk, p.Dv});
  Tensor dscores;
  if (o.mask_grad) {
    dscores = Tensor::empty({p.B, p.Hq, p.Lq, p.Lk}, ld);
    p.dscores = dscores;
  }
  const DType sinks_dtype = o.sinks.defined() ? o.sinks.dtype() : DType::f32;
  if (r.drops_all && !dweights.defined()) {
    for (Tensor* t : {&g.dq, &g.dk, &g.dv}) t->fill(0.0);
    if (o.mask_grad) dscores.fill(0.0);
    if (o.sinks.defined()) g.dsinks = Tensor::zeros({p.Hq}, sinks_dtype);
  } else {
    if (r.drops_all) {
      // Every weight dropped: out is 0 and dout reaches nothing; only the weights' gradient remains.
      p.dout = Tensor::zeros({p.B, p.Hq, p.Lq, p.Dv}, p.dtype);
      p.out = p.dout;
    }
    const std::vector<double> dsinks = detail::run_backward(backend, p);
    if (o.sinks.defined()) g.dsinks = Tensor::from_vector({p.Hq}, dsinks, sinks_dtype);
  }
  if (o.mask_grad) g.dmask = contract::reduce_to_mask(dscores, r, o.mask.dtype());
  return g;
} catch (const std::bad_alloc&) {
  throw Error(fmt::format("attn::attention_backward: out of memory for q {}, k {}, v {}",
                          q.shape_str(), k.shape_str(), v.shape_str()));
} catch (const std::length_error&) {
  throw Error(fmt::format("attn::attention_backward: sizes too large for q {}, k {}, v {}",
                          q.shape_str(), k.shape_str(), v.shape_str()));
}

}  // namespace attn
