// Ring attention's validation: each rank checks its own tensors and options (with attn::attention's
// own checks on empty slices), the ranks share what they hold in one MPI_Allgather, and every rank
// then checks the same data and builds the same Setup (the plan of which rectangles to compute).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/options.h"
#include "contract/options.h"
#include "distributed/ring_setup.h"

namespace attn::distributed {

namespace {

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

void hash_tensor(Hash& h, const Tensor& t) {
  h.add(t.defined());
  if (!t.defined()) return;
  h.add(t.numel());
  for (double x : t.to_vector()) h.add(x);
}

// One option's value into the hash, by its kind (attn/options.h).
void hash_option(Hash& h, const OptionInfo& info, const AttentionOptions& o) {
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(o.*m)>;
        const T& v = o.*m;
        if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
          h.add(v);
        } else if constexpr (std::is_same_v<T, std::optional<double>> ||
                             std::is_same_v<T, std::optional<int64_t>>) {
          h.add(v.has_value());
          h.add(v.value_or(0));
        } else if constexpr (std::is_same_v<T, Window>) {
          h.add(v.left);
          h.add(v.right);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          hash_tensor(h, v);
        } else {
          static_assert(std::is_same_v<T, BlockLayout>);
          hash_tensor(h, v.layout);
          h.add(v.block_q);
          h.add(v.block_k);
        }
      },
      info.field);
}

// The options every rank must hold equal, named: "causal, align, ... and alibi_slopes".
std::string agreed_option_names() {
  std::vector<std::string> names;
  for (const OptionInfo& info : kOptionInfo) {
    if (info.ring == RingUse::agree) names.emplace_back(info.name);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

// What each rank tells the others once per call (fixed size for one MPI_Allgather).
struct RankMeta {
  int32_t ndim = 0;
  int32_t dtype = 0;
  int64_t q[kMaxDims] = {}, k[kMaxDims] = {}, v[kMaxDims] = {};
  uint64_t options_hash = 0;
};

std::string shape_of(const int64_t* s, int n) {
  return shape_to_string(Shape(s, s + n));
}

// ---- Rank-local checks: each returns "" or the message.

std::string check_ranks(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  for (auto [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (!t->defined()) return fmt::format("{}: {} is undefined", fn, name);
    if (t->dim() < 3 || t->dim() > kMaxDims) {
      return fmt::format("{}: {} must have rank 3 to {} ([..., heads, length, dim]), got shape {}",
                         fn, name, kMaxDims, t->shape_str());
    }
  }
  return {};
}

// The options a rank cannot apply to its blocks alone.
std::string unsupported_option(const char* fn, const AttentionOptions& o) {
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
  if (o.sinks.defined()) {
    return fmt::format(
        "{}: sinks are not supported (sinks {}): each block's call would count the sink once more",
        fn, o.sinks.shape_str());
  }
  if (o.return_weights)
    return fmt::format("{}: return_weights is not supported (the weights are Lq x Lk)", fn);
  if (o.mask_grad) return fmt::format("{}: mask_grad is not supported (no dense masks)", fn);
  return {};
}

// attn::attention's own validation, on empty slices: shapes, dtypes, heads, scale, softcap,
// window, ALiBi, backend; for the backward also dout, out and lse. key_lengths are checked by
// read_key_lengths and validate_global against the global key length.
std::string dry_run(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionOptions& o, const Tensor* dout, const Tensor* out,
                    const Tensor* lse) {
  AttentionOptions dry = o;
  dry.key_lengths = Tensor();
  const Tensor q0 = q.slice(-2, 0, 0), k0 = k.slice(-2, 0, 0), v0 = v.slice(-2, 0, 0);
  try {
    if (dout == nullptr) {
      (void)attention(q0, k0, v0, dry);
      return {};
    }
    for (auto [name, t] : {std::pair{"dout", dout}, std::pair{"out", out}, std::pair{"lse", lse}}) {
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
          fn, shape_to_string(out_shape), shape_to_string(lse_shape), q.shape_str(), v.shape_str(),
          dout->shape_str(), out->shape_str(), lse->shape_str());
    }
    (void)attention_backward(dout->slice(-2, 0, 0), q0, k0, v0, out->slice(-2, 0, 0),
                             lse->slice(-1, 0, 0), dry);
  } catch (const Error& e) {
    return fmt::format("{}: {}", fn, e.what());
  }
  return {};
}

// key_lengths by attn::attention's check (contract/options.h), but for the upper bound: the global
// key length is known once every rank has spoken (key_limit_of).
std::string read_key_lengths(const char* fn, const Tensor& q, const AttentionOptions& o,
                             std::vector<int64_t>* key_lengths) {
  const Shape batch(q.shape().begin(), q.shape().end() - 3);
  key_lengths->clear();
  if (!o.key_lengths.defined()) return {};
  const std::string problem =
      contract::check_key_lengths(o.key_lengths, batch, checked_numel(batch, fn), -1, key_lengths);
  return problem.empty() ? problem : fmt::format("{}: {}", fn, problem);
}

// This rank's shapes, dtype and a hash of the options that must agree across ranks.
RankMeta describe(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                  RingLayout layout) {
  RankMeta meta;
  meta.ndim = q.dim();
  meta.dtype = static_cast<int32_t>(q.dtype());
  for (int d = 0; d < q.dim(); ++d) {
    meta.q[d] = q.size(d);
    meta.k[d] = k.size(d);
    meta.v[d] = v.size(d);
  }
  Hash h;
  for (const OptionInfo& info : kOptionInfo) {
    if (info.ring == RingUse::agree) hash_option(h, info, o);
  }
  h.add(layout);
  meta.options_hash = h.h;
  return meta;
}

// Rank-local checks; returns "" or the message. Fills `meta` and the key lengths.
std::string validate_local(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionOptions& o, RingLayout layout, const Tensor* dout,
                           const Tensor* out, const Tensor* lse, RankMeta* meta,
                           std::vector<int64_t>* key_lengths) {
  // In this order: each check relies on the ones before it (dry_run and read_key_lengths on ranks).
  if (std::string e = check_ranks(fn, q, k, v); !e.empty()) return e;
  if (std::string e = unsupported_option(fn, o); !e.empty()) return e;
  if (std::string e = dry_run(fn, q, k, v, o, dout, out, lse); !e.empty()) return e;
  if (std::string e = read_key_lengths(fn, q, o, key_lengths); !e.empty()) return e;
  *meta = describe(q, k, v, o, layout);
  return {};
}

// ---- Checks on every rank's metadata: the same verdict on every rank (same data).

// Every rank has rank 0's dtype, tensor ranks, shapes (but for the sequence dim) and options.
std::string check_ranks_agree(const char* fn, const std::vector<RankMeta>& all) {
  const RankMeta& a0 = all[0];
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
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
          "{}: the options of rank {} differ from rank 0's ({} and the layout must be equal on "
          "every rank)",
          fn, r, agreed_option_names());
    }
  }
  return {};
}

// The global positions each rank's queries and keys hold; under zigzag, each rank must hold what
// the layout gives it.
std::string rank_segments(const char* fn, const std::vector<RankMeta>& all, RingLayout layout,
                          int64_t Lq, int64_t Lk, std::vector<std::vector<RingSegment>>* q_segs,
                          std::vector<std::vector<RingSegment>>* k_segs) {
  const int P = static_cast<int>(all.size());
  const int n = all[0].ndim;
  q_segs->assign(P, {});
  k_segs->assign(P, {});
  int64_t q_start = 0, k_start = 0;
  for (int r = 0; r < P; ++r) {
    const int64_t lq = all[r].q[n - 2], lk = all[r].k[n - 2];
    if (layout == RingLayout::contiguous) {
      (*q_segs)[r] = {{q_start, lq, 0}};
      (*k_segs)[r] = {{k_start, lk, 0}};
      q_start += lq;
      k_start += lk;
      continue;
    }
    (*q_segs)[r] = ring_segments(Lq, r, P, layout);
    (*k_segs)[r] = ring_segments(Lk, r, P, layout);
    const int64_t want_q = (*q_segs)[r][0].length + (*q_segs)[r][1].length;
    const int64_t want_k = (*k_segs)[r][0].length + (*k_segs)[r][1].length;
    if (lq != want_q || lk != want_k) {
      return fmt::format(
          "{}: rank {} holds {} queries and {} keys, but the zigzag layout of Lq = {} and Lk = {} "
          "over {} ranks gives it {} and {} (use attn::ring_shard)",
          fn, r, lq, lk, Lq, Lk, P, want_q, want_k);
    }
  }
  return {};
}

// The largest global key any row may use: Lk, or the longest key length.
std::string key_limit_of(const char* fn, const std::vector<int64_t>& key_lengths, int64_t Lk,
                         int64_t* key_limit) {
  *key_limit = Lk;
  if (key_lengths.empty()) return {};
  *key_limit = 0;
  for (size_t b = 0; b < key_lengths.size(); ++b) {
    if (key_lengths[b] > Lk) {
      return fmt::format("{}: {} (the global key length)", fn,
                         contract::key_length_outside(b, static_cast<double>(key_lengths[b]), Lk));
    }
    *key_limit = std::max(*key_limit, key_lengths[b]);
  }
  return {};
}

// The position rule in global coordinates.
PositionBounds position_bounds(const AttentionOptions& o, int64_t Lq, int64_t Lk,
                               int64_t key_limit) {
  PositionBounds bounds;
  bounds.offset = contract::query_offset(o, Lq, Lk);
  bounds.left = contract::window_bound(o.window.left);
  bounds.right = contract::right_bound(o, contract::window_bound(o.window.right));
  bounds.key_limit = key_limit;
  return bounds;
}

// Checks that need every rank's metadata, then the setup: shapes, segments and the plan.
std::string validate_global(const char* fn, const std::vector<RankMeta>& all,
                            const AttentionOptions& o, RingLayout layout,
                            const std::vector<int64_t>& key_lengths, Setup* s) {
  if (std::string error = check_ranks_agree(fn, all); !error.empty()) return error;
  const RankMeta& a0 = all[0];
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
  std::vector<std::vector<RingSegment>> q_segs, k_segs;
  if (std::string error = rank_segments(fn, all, layout, Lq, Lk, &q_segs, &k_segs);
      !error.empty()) {
    return error;
  }
  int64_t key_limit = Lk;
  if (std::string error = key_limit_of(fn, key_lengths, Lk, &key_limit); !error.empty()) {
    return error;
  }
  s->key_lengths = key_lengths;
  s->plan = make_plan(position_bounds(o, Lq, Lk, key_limit), std::move(q_segs), std::move(k_segs));
  return {};
}

}  // namespace

Setup collective_setup(const char* fn, const PrivateComm& pc, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& o, RingLayout layout,
                       const Tensor* dout, const Tensor* out, const Tensor* lse) {
  RankMeta meta;
  std::vector<int64_t> key_lengths;
  std::string error;
  try {
    error = validate_local(fn, q, k, v, o, layout, dout, out, lse, &meta, &key_lengths);
  } catch (const std::exception& e) {
    error = fmt::format("{}: {}", fn, e.what());
  }
  const std::string agreed = agree_on_error(pc.get(), fn, error);
  if (!agreed.empty()) throw Error(fmt::format("{} (every rank stopped)", agreed));
  std::vector<RankMeta> all(pc.size());
  MPI_Allgather(&meta, sizeof(RankMeta), MPI_BYTE, all.data(), sizeof(RankMeta), MPI_BYTE,
                pc.get());
  Setup s;
  error = validate_global(fn, all, o, layout, key_lengths, &s);
  if (!error.empty()) throw Error(fmt::format("{} (every rank stopped)", error));
  return s;
}

}  // namespace attn::distributed
