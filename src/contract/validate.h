// The checks every attention entry point shares (attn::attention, attn::attention_backward, the varlen
// entries, src/attention*.cc): the argument checks in the contract's order, the canonical problem they
// build (contract/problem.h) and the choice of backend. Every check throws attn::Error whose message
// starts with the entry's name `fn` (core/fail.h).
#pragma once
#include <fmt/format.h>

#include <string>
#include <string_view>

#include "attn/attention.h"
#include "attn/options.h"
#include "contract/problem.h"
#include "core/fail.h"

namespace attn::contract {

// What validate() makes of attention(q, k, v, options): the problem and the user's shapes.
struct Validated {
  ForwardProblem p;
  Shape batch;       // leading batch dims
  Shape out_shape;   // [batch..., Hq, Lq, Dv]
  Shape lse_shape;   // [batch..., Hq, Lq]
  Shape mask_shape;  // the user's mask shape (for d(add mask))
  // dropout_p == 1: every weight is dropped, so out and every gradient are 0 (the backends run
  // without dropout for lse and weights; 1 / (1 - p) is never formed).
  bool drops_all = false;
};

// Checks every argument (in this order: the first failing check names the error) and builds the
// canonical 4-D problem.
Validated validate(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionOptions& o);

// An enum option holding a value outside its enum (a cast from an int): refused, not run as
// whichever branch the backends' switches fall into (mask_type 7 gave different answers on cpu and
// reference).
template <class E>
void check_enum(const char* fn, const char* field, E value) {
  if (std::string_view(enum_name(value)) == "?") {
    detail::fail(fn, fmt::format("{} {} is not a {} ({})", field, static_cast<int>(value),
                                 EnumInfo<E>::what, enum_choices<E>()));
  }
}

// A floating tensor named `name` (undefined or of another dtype: the error names it and its shape).
void check_float(const char* fn, const char* name, const Tensor& t);
// Every real option of the table by its rule (attn/options.h).
void check_scalars(const char* fn, const AttentionOptions& o);
// scale (default 1 / sqrt(p.D)) and softcap (0 = none) into p.
void resolve_scores(const AttentionOptions& o, ForwardProblem& p);
// The position rule of p (p.Lq and p.Lk set): window bounds, position_offset, causal.
void check_position_rule(const char* fn, const AttentionOptions& o, ForwardProblem& p);
// ALiBi slopes: floating [Hq] (p.Hq set), finite.
void check_alibi(const char* fn, const AttentionOptions& o, ForwardProblem& p);
// Sink logits: floating [Hq] (p.Hq set), finite.
void check_sinks(const char* fn, const AttentionOptions& o, ForwardProblem& p);
// dropout_p and seed into r.p.dropout (p = 1: r.drops_all).
void resolve_dropout(const AttentionOptions& o, Validated& r);
// The threads of a call that asks for none, by its multiply-adds (core/parallel.h).
int threads_for(const ForwardProblem& p);

// The leading `nb` dims of t merged into one (a view when their strides allow, else a copy), the last
// dim unit-stride: [B, rest...].
Tensor merge_batch(const Tensor& t, int nb);
// t's dims before the last three.
Shape batch_dims(const Tensor& t);
// f64 for f64 problems, else f32.
DType lse_dtype(DType t);
// d(scores) [B, Hq, Lq, Lk] summed over the dims the user's mask broadcast along: d(add mask).
Tensor reduce_to_mask(const Tensor& dscores, const Validated& r, DType mask_dtype);
// dL/dweights checked against the weights' shape [batch..., Hq, Lq, Lk]: a 4-D view.
Tensor checked_dweights(const char* fn, const Tensor& dw, const Validated& r, int nb);
// The backend that runs p: automatic takes the cpu kernels for the dtypes and option ranges they run,
// else the reference; an explicit cpu refuses what it cannot compute.
Backend backend_for(const char* fn, Backend requested, const ForwardProblem& p);

}  // namespace attn::contract
