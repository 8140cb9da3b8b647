// The checks every attention entry point shares (attn::attention, attn::attention_backward, the varlen
// entries): the argument checks in the contract's order, the canonical 4-D problem they build, and the
// choice of backend. Messages start with the entry's name (core/fail.h).
#include "contract/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/options.h"
#include "backends/cpu/attention_cpu.h"
#include "contract/options.h"
#include "core/fail.h"
#include "core/parallel.h"

namespace attn::contract {

using detail::fail;

namespace {

// True when the leading nb dims of t can be walked as one index with one stride: each non-trivial batch dim's
// stride equals the next non-trivial one's stride times its size. Size-1 dims are skipped (their stride is never
// used), but must not hide a mismatch between the dims around them ([2, 1, 3] from [3, 1, 2] storage).
bool batch_mergeable(const Tensor& t, int nb) {
  int prev = -1;
  for (int d = 0; d < nb; ++d) {
    if (t.size(d) == 1) continue;
    if (prev >= 0 && t.stride(prev) != t.stride(d) * t.size(d)) return false;
    prev = d;
  }
  return true;
}

}  // namespace

// Merges the leading `nb` dims of t into one (copying when their strides do not allow a view) and makes
// the last dim unit-stride: the result is [B, rest...].
Tensor merge_batch(const Tensor& t_in, int nb) {
  Tensor t = t_in;
  if (t.dim() > 1 && t.size(-1) > 1 && t.stride(-1) != 1) t = t.contiguous();
  Shape shape, strides;
  int64_t B = 1;
  for (int d = 0; d < nb; ++d) B *= t.size(d);
  if (!batch_mergeable(t, nb)) t = t.contiguous();
  // Stride of the merged dim: the innermost non-trivial batch dim's stride (any value when B <= 1).
  int64_t bstride = 0;
  for (int d = nb - 1; d >= 0; --d) {
    if (t.size(d) != 1) {
      bstride = t.stride(d);
      break;
    }
  }
  shape.push_back(B);
  strides.push_back(bstride);
  for (int d = nb; d < t.dim(); ++d) {
    shape.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  return t.as_strided(shape, strides);
}

Shape batch_dims(const Tensor& t) {
  return Shape(t.shape().begin(), t.shape().end() - 3);
}

namespace {

// Broadcasts a per-(batch, head, row, key) tensor (mask or block layout) of any rank <= nb + 3 to
// [batch..., H, R, C] and merges the batch dims into one: a 4-D view [B, H, R, C] with stride 0 where it
// broadcasts. Copies only the batch dims' worth of data when their strides cannot merge.
Tensor broadcast_4d(const Tensor& m, const Shape& full, int nb) {
  Tensor padded = m;
  while (padded.dim() < static_cast<int>(full.size())) padded = padded.unsqueeze(0);
  Tensor e = padded.expand(full);
  if (!batch_mergeable(e, nb)) {
    Shape batch_full = full;
    for (int d = nb; d < static_cast<int>(full.size()); ++d) batch_full[d] = padded.size(d);
    e = padded.expand(batch_full).contiguous().expand(full);
  }
  return merge_batch(e, nb);
}

}  // namespace

// The threads of a call that asks for none: by its multiply-adds (B Hq Lq Lk (D + Dv) in the
// forward), one for a decode step against a short cache (core/parallel.h).
int threads_for(const ForwardProblem& p) {
  return threads_for_work(static_cast<double>(p.B) * static_cast<double>(p.Hq) *
                          static_cast<double>(p.Lq) * static_cast<double>(p.Lk) *
                          static_cast<double>(p.D + p.Dv));
}

void check_float(const char* fn, const char* name, const Tensor& t) {
  if (!t.defined()) fail(fn, fmt::format("{} is undefined", name));
  if (!is_floating(t.dtype())) {
    fail(fn, fmt::format("{} must be f64, f32, bf16 or f16, got {} with shape {}", name,
                         dtype_name(t.dtype()), t.shape_str()));
  }
}

namespace {

// q, k and v: floating, one dtype, rank >= 3, equal batch dims, q and k one head dim, k and v one
// length and head count, whole query groups per key/value head.
void check_qkv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float(fn, "q", q);
  check_float(fn, "k", k);
  check_float(fn, "v", v);
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail(fn, fmt::format("q, k and v must share one dtype, got q {} {}, k {} {}, v {} {}",
                         dtype_name(q.dtype()), q.shape_str(), dtype_name(k.dtype()), k.shape_str(),
                         dtype_name(v.dtype()), v.shape_str()));
  }
  for (auto [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (t->dim() < 3) {
      fail(fn, fmt::format("{} must have rank >= 3 ([..., heads, length, dim]), got shape {}", name,
                           t->shape_str()));
    }
  }
  if (q.dim() != k.dim() || q.dim() != v.dim()) {
    fail(fn, fmt::format("q, k and v must have the same rank, got q {}, k {}, v {}", q.shape_str(),
                         k.shape_str(), v.shape_str()));
  }
  if (const std::string problem = contract::check_qkv_shapes(q, k, v); !problem.empty()) {
    fail(fn, problem);
  }
}

// A scalar option's rule (attn/options.h): "<name> <must>, got <value>".
void check_scalar(const char* fn, const ScalarRule& rule, double value) {
  if (!rule.allows(value)) fail(fn, fmt::format("{} {}, got {}", rule.name, rule.must, value));
}

}  // namespace

// Every real option by its rule (attn/options.h), in the table's order: an unset optional is not
// checked.
void check_scalars(const char* fn, const AttentionOptions& o) {
  for (const OptionInfo& info : kOptionInfo) {
    if (info.rule == nullptr) continue;
    if (auto m = field_as<std::optional<double>>(info); m && (o.*m).has_value()) {
      check_scalar(fn, *info.rule, *(o.*m));
    } else if (auto r = field_as<double>(info)) {
      check_scalar(fn, *info.rule, o.*r);
    }
  }
}

// The score's scalars as the backends read them: scale (default 1 / sqrt(D)), softcap (0 = none).
void resolve_scores(const AttentionOptions& o, ForwardProblem& p) {
  p.scale = o.scale ? *o.scale : (p.D > 0 ? 1.0 / std::sqrt(static_cast<double>(p.D)) : 1.0);
  p.softcap = o.softcap.value_or(0.0);
}

// The position rule: window bounds >= -1, |position_offset| < 2^60, causal = right bound 0.
void check_position_rule(const char* fn, const AttentionOptions& o, ForwardProblem& p) {
  if (!kWindowRule.allows(static_cast<double>(o.window.left)) ||
      !kWindowRule.allows(static_cast<double>(o.window.right))) {
    fail(fn, fmt::format("{} {}, got ({}, {})", kWindowRule.name, kWindowRule.must, o.window.left,
                         o.window.right));
  }
  if (o.position_offset) {
    constexpr int64_t kLimit = int64_t{1} << 60;
    if (*o.position_offset <= -kLimit || *o.position_offset >= kLimit) {
      fail(fn,
           fmt::format("position_offset {} is out of range (|offset| < 2^60)", *o.position_offset));
    }
  }
  p.rule.Lq = p.Lq;
  p.rule.Lk = p.Lk;
  p.rule.offset = contract::query_offset(o, p.Lq, p.Lk);
  p.rule.left = contract::window_bound(o.window.left);
  p.rule.right = contract::right_bound(o, contract::window_bound(o.window.right));
}

namespace {

// True when the shape of t broadcasts to `full` (no more dims; each trailing dim equal or 1).
bool broadcasts_to(const Tensor& t, const Shape& full) {
  bool ok = t.dim() <= static_cast<int>(full.size());
  for (int d = 1; ok && d <= t.dim(); ++d) {
    const int64_t ms = t.size(-d), fs = full[full.size() - d];
    ok = ms == fs || ms == 1;
  }
  return ok;
}

// The mask: floating for 'add', bool otherwise, broadcastable to the scores [..., Hq, Lq, Lk].
void check_mask(const char* fn, const AttentionOptions& o, const Shape& full_shape, int nb,
                Validated& r) {
  if (!o.mask.defined()) return;
  const Tensor& m = o.mask;
  if (o.mask_type == MaskType::add) {
    if (!is_floating(m.dtype())) {
      fail(fn, fmt::format("mask of type 'add' must be floating, got {} with shape {}",
                           dtype_name(m.dtype()), m.shape_str()));
    }
  } else if (m.dtype() != DType::boolean) {
    fail(fn, fmt::format("mask of type '{}' must be bool, got {} with shape {}",
                         mask_type_name(o.mask_type), dtype_name(m.dtype()), m.shape_str()));
  }
  if (!broadcasts_to(m, full_shape)) {
    fail(fn, fmt::format(
                 "mask of shape {} does not broadcast to the scores' shape {} ([..., Hq, Lq, Lk])",
                 m.shape_str(), shape_to_string(full_shape)));
  }
  r.p.mask = broadcast_4d(m, full_shape, nb);
  r.p.mask_type = o.mask_type;
  r.mask_shape = m.shape();
}

// key_lengths (contract/options.h): i32 or i64, the batch dims' shape, each value in [0, Lk].
void check_key_lengths(const char* fn, const AttentionOptions& o, const Shape& batch,
                       ForwardProblem& p) {
  if (!o.key_lengths.defined()) return;
  const std::string problem =
      contract::check_key_lengths(o.key_lengths, batch, p.B, p.Lk, &p.key_length);
  if (!problem.empty()) fail(fn, problem);
}

// Whether key j of a mask row (elements `stride` apart) is allowed (1), removed (0) or neither (-1:
// an add mask's finite, nonzero bias). keep / drop: bool; add: 0 allows, -inf removes.
int key_state(const char* row, int64_t j, int64_t stride, DType dtype, MaskType type) {
  const char* at = row + j * stride * static_cast<int64_t>(dtype_size(dtype));
  if (type != MaskType::add)
    return (*reinterpret_cast<const unsigned char*>(at) != 0) == (type == MaskType::keep);
  double v = 0.0;
  switch (dtype) {
    case DType::f64:
      v = *reinterpret_cast<const double*>(at);
      break;
    case DType::f32:
      v = *reinterpret_cast<const float*>(at);
      break;
    case DType::bf16:
      v = bf16_to_f32(*reinterpret_cast<const uint16_t*>(at));
      break;
    case DType::f16:
      v = f16_to_f32(*reinterpret_cast<const uint16_t*>(at));
      break;
    default:
      return -1;
  }
  return v == 0.0 ? 1 : v == -std::numeric_limits<double>::infinity() ? 0 : -1;
}

// A mask that depends on (batch, key) only and allows a prefix of the keys of every batch entry
// (keep: true then false; drop: false then true; add: 0 then -inf: right-padded batches, HF's
// attention_mask) is the key-length rule (contract/mask.h) in another form: it becomes key lengths
// (the smaller, with the user's own) and no mask, so the kernels skip the padded tiles instead of
// reading the mask, and decode stays on its fast path. The results are the same (removed keys are
// skipped either way). A mask with a gap, a finite bias, or one that varies over heads or query
// rows stays a mask. d(add mask) is unchanged: a skipped key's d(score) is 0, as a removed one's.
void fold_prefix_mask(ForwardProblem& p) {
  const Tensor& m = p.mask;
  if (!m.defined() || m.numel() == 0) return;  // no element to read (Lq or Lk 0: nothing to fold)
  if ((p.Hq > 1 && m.stride(1) != 0) || (p.Lq > 1 && m.stride(2) != 0)) return;
  const char* base = static_cast<const char*>(m.data());
  const int64_t row_bytes = m.stride(0) * static_cast<int64_t>(m.itemsize()), sj = m.stride(3);
  std::vector<int64_t> lengths(static_cast<size_t>(p.B));
  for (int64_t b = 0; b < p.B; ++b) {
    const char* row = base + b * row_bytes;
    int64_t n = 0;
    int state = 1;
    while (n < p.Lk && (state = key_state(row, n, sj, m.dtype(), p.mask_type)) == 1) ++n;
    if (state < 0) return;
    for (int64_t j = n + 1; j < p.Lk; ++j)
      if (key_state(row, j, sj, m.dtype(), p.mask_type) != 0) return;  // allowed after removed
    lengths[b] = std::min(n, p.key_length_of(b));
  }
  p.mask = Tensor();
  const bool pads =
      std::any_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n < p.Lk; });
  p.key_length = pads ? std::move(lengths) : std::vector<int64_t>();
}

// The block layout: blocks > 0, bool, broadcastable to the tile grid [..., Hq, tiles_q, tiles_k].
void check_block_layout(const char* fn, const AttentionOptions& o, const Shape& batch,
                        ForwardProblem& p) {
  if (!o.block_layout.layout.defined()) return;
  const BlockLayout& bl = o.block_layout;
  if (bl.block_q <= 0 || bl.block_k <= 0) {
    fail(fn, fmt::format("block layout sizes must be > 0, got block_q {} and block_k {}",
                         bl.block_q, bl.block_k));
  }
  if (bl.layout.dtype() != DType::boolean) {
    fail(fn, fmt::format("block layout must be bool, got {} with shape {}",
                         dtype_name(bl.layout.dtype()), bl.layout.shape_str()));
  }
  // ceil(n / block) without n + block - 1, which overflows for a block near INT64_MAX
  auto tiles_of = [](int64_t n, int64_t block) { return n == 0 ? 0 : (n - 1) / block + 1; };
  Shape tiles = batch;
  tiles.insert(tiles.end(), {p.Hq, tiles_of(p.Lq, bl.block_q), tiles_of(p.Lk, bl.block_k)});
  if (!broadcasts_to(bl.layout, tiles)) {
    fail(fn, fmt::format(
                 "block layout of shape {} does not broadcast to the tile grid {} (blocks {} x {})",
                 bl.layout.shape_str(), shape_to_string(tiles), bl.block_q, bl.block_k));
  }
  p.block_layout = broadcast_4d(bl.layout, tiles, static_cast<int>(batch.size()));
  p.block_q = bl.block_q;
  p.block_k = bl.block_k;
}

}  // namespace

// ALiBi slopes: a floating vector [Hq] of finite values.
void check_alibi(const char* fn, const AttentionOptions& o, ForwardProblem& p) {
  if (!o.alibi_slopes.defined()) return;
  const Tensor& a = o.alibi_slopes;
  if (!is_floating(a.dtype()) || a.dim() != 1 || a.size(0) != p.Hq) {
    fail(fn, fmt::format("alibi_slopes must be a floating vector [Hq = {}], got {} with shape {}",
                         p.Hq, dtype_name(a.dtype()), a.shape_str()));
  }
  p.alibi = a.to_vector();
  for (size_t h = 0; h < p.alibi.size(); ++h) {
    if (!std::isfinite(p.alibi[h]))
      fail(fn, fmt::format("alibi_slopes[{}] = {} is not finite", h, p.alibi[h]));
  }
}

void check_sinks(const char* fn, const AttentionOptions& o, ForwardProblem& p) {
  if (!o.sinks.defined()) return;
  const Tensor& s = o.sinks;
  if (!is_floating(s.dtype()) || s.dim() != 1 || s.size(0) != p.Hq) {
    fail(fn, fmt::format("sinks must be a floating vector [Hq = {}], got {} with shape {}", p.Hq,
                         dtype_name(s.dtype()), s.shape_str()));
  }
  p.sinks = s.to_vector();
  for (size_t h = 0; h < p.sinks.size(); ++h) {
    if (!std::isfinite(p.sinks[h]))
      fail(fn, fmt::format("sinks[{}] = {} is not finite", h, p.sinks[h]));
  }
}

// dropout_p (checked by its rule) = 1 drops everything (Validated::drops_all).
void resolve_dropout(const AttentionOptions& o, Validated& r) {
  r.drops_all = o.dropout_p == 1.0;
  r.p.dropout.p = r.drops_all ? 0.0 : o.dropout_p;
  r.p.dropout.seed = o.seed;
}

// Checks every argument (in this order: the first failing check names the error) and builds the
// canonical 4-D problem.
Validated validate(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionOptions& o) {
  check_enum(fn, "backend", o.backend);
  check_enum(fn, "align", o.align);
  check_enum(fn, "mask_type", o.mask_type);
  check_qkv(fn, q, k, v);
  const Shape batch = batch_dims(q);
  const int64_t Hq = q.size(-3), Lq = q.size(-2), D = q.size(-1);
  const int64_t Hkv = k.size(-3), Lk = k.size(-2);
  const int64_t Dv = v.size(-1);
  Shape out_shape = batch, lse_shape = batch;
  out_shape.insert(out_shape.end(), {Hq, Lq, Dv});
  lse_shape.insert(lse_shape.end(), {Hq, Lq});
  const int64_t B = checked_numel(batch, fn);
  checked_numel(out_shape, fn);
  checked_numel(q.shape(), fn);
  checked_numel(k.shape(), fn);
  checked_numel(v.shape(), fn);
  Shape full_shape = batch;
  full_shape.insert(full_shape.end(), {Hq, Lq, Lk});
  if (o.return_weights || o.mask_grad) checked_numel(full_shape, fn);

  Validated r;
  ForwardProblem& p = r.p;
  r.batch = batch;
  r.out_shape = out_shape;
  r.lse_shape = lse_shape;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Lq = Lq, p.Lk = Lk, p.D = D, p.Dv = Dv;
  p.group = Hkv > 0 ? Hq / Hkv : 1;
  p.dtype = q.dtype();

  const int nb = static_cast<int>(batch.size());
  check_scalars(fn, o);
  resolve_scores(o, p);
  check_position_rule(fn, o, p);
  check_mask(fn, o, full_shape, nb, r);
  check_key_lengths(fn, o, batch, p);
  fold_prefix_mask(p);
  check_block_layout(fn, o, batch, p);
  check_alibi(fn, o, p);
  check_sinks(fn, o, p);
  resolve_dropout(o, r);
  p.threads = o.threads > 0 ? o.threads : threads_for(p);

  p.q = merge_batch(q, nb);
  p.k = merge_batch(k, nb);
  p.v = merge_batch(v, nb);
  return r;
}

DType lse_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// Sums d(scores) [B, Hq, Lq, Lk] over the dims the user's mask broadcast along: d(add mask) in its shape.
Tensor reduce_to_mask(const Tensor& dscores, const Validated& r, DType mask_dtype) {
  const int R = static_cast<int>(r.batch.size()) + 3;
  Shape full = r.batch;
  full.insert(full.end(), {r.p.Hq, r.p.Lq, r.p.Lk});
  Shape padded(R, 1);
  const int md = static_cast<int>(r.mask_shape.size());
  for (int d = 0; d < md; ++d) padded[R - md + d] = r.mask_shape[d];
  Tensor acc = Tensor::zeros(padded, DType::f64);
  const Shape acc_strides = contiguous_strides(padded);
  const Tensor src = dscores.contiguous();
  const int64_t n = src.numel();
  std::vector<int64_t> idx(R, 0);
  double* a = acc.data_as<double>();
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (int d = 0; d < R; ++d) off += (padded[d] == 1 ? 0 : idx[d]) * acc_strides[d];
    a[off] += load_as_double(
        static_cast<const char*>(src.data()) + e * static_cast<int64_t>(src.itemsize()),
        src.dtype());
    for (int d = R - 1; d >= 0; --d) {
      if (++idx[d] < full[d]) break;
      idx[d] = 0;
    }
  }
  return acc.view(r.mask_shape).to(mask_dtype);
}

namespace {

// The cpu kernels take scale, softcap and the ALiBi slopes as floats: past float's range a value
// became inf there, and every score NaN (scale 1e39 gave NaN out, lse and dq; the reference, in
// double, is finite). The first such option, or "".
std::string beyond_float_range(const ForwardProblem& p) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (std::abs(p.scale) > kMax) return fmt::format("scale {}", p.scale);
  if (p.softcap > kMax) return fmt::format("softcap {}", p.softcap);
  for (size_t h = 0; h < p.alibi.size(); ++h) {
    if (std::abs(p.alibi[h]) > kMax) return fmt::format("alibi_slopes[{}] = {}", h, p.alibi[h]);
  }
  return "";
}

}  // namespace

// The backend that runs p: automatic takes the cpu kernels for the dtypes they run and options in
// their range, else the reference; an explicit cpu refuses what it cannot compute.
// dL/dweights: floating, the weights' shape [batch..., Hq, Lq, Lk]; as a 4-D view [B, Hq, Lq, Lk].
Tensor checked_dweights(const char* fn, const Tensor& dw, const Validated& r, int nb) {
  Shape want = r.lse_shape;
  want.push_back(r.p.Lk);
  if (!is_floating(dw.dtype()) || dw.shape() != want) {
    fail(fn,
         fmt::format("dweights must be floating with the weights' shape {}, got {} with shape {}",
                     shape_to_string(want), dtype_name(dw.dtype()), dw.shape_str()));
  }
  return merge_batch(dw, nb);
}

Backend backend_for(const char* fn, Backend requested, const ForwardProblem& p) {
  const std::string wide = beyond_float_range(p);
  if (requested == Backend::automatic && !wide.empty()) return Backend::reference;
  const Backend backend = resolve_backend(requested, p.dtype);
  if (backend != Backend::cpu) return backend;
  if (!cpu::supports(p.dtype)) {
    fail(fn, fmt::format("the cpu backend does not run {} inputs (use backend auto or reference)",
                         dtype_name(p.dtype)));
  }
  if (!wide.empty()) {
    fail(fn, fmt::format("{} is beyond the float range of the cpu backend's kernels (use backend "
                         "auto or reference)",
                         wide));
  }
  return backend;
}

}  // namespace attn::contract
