// The attention fuzz harness's problem: input bytes -> a small attention case (dtype, batch dims,
// heads, lengths, head dims, memory layouts, every option of the contract), the independent
// restatement of which keys a row may use, and the comparison helpers the checks share.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "fuzz/fuzz_input.h"

namespace attn::fuzz::attention_detail {

// SplitMix64: the tensors' values come from a seed taken from the input, so inputs stay short.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1p-53;
  }
  bool bernoulli(double p) { return uniform(0, 1) < p; }
};

// Logical `shape` of random values in [-2, 2], laid out in memory as `layout` says:
// 0 contiguous, 1 heads and length swapped in storage, 2 padded rows, 3 every other row, 4
// broadcast heads (stride 0), 5 last dim stride 2, 6 one row broadcast along the length (stride 0:
// the fast path must not read it in place at another stride).
inline Tensor make_input(Rng& rng, const Shape& shape, DType dt, int layout) {
  Shape phys = shape;
  const size_t r = shape.size();
  switch (layout) {
    case 1:
      std::swap(phys[r - 3], phys[r - 2]);
      break;
    case 2:
      phys[r - 1] += 3;
      break;
    case 3:
      phys[r - 2] *= 2;
      break;
    case 4:
      phys[r - 3] = 1;
      break;
    case 5:
      phys[r - 1] *= 2;
      break;
    case 6:
      phys[r - 2] = 1;
      break;
    default:
      break;
  }
  std::vector<double> values(static_cast<size_t>(checked_numel(phys, "fuzz")));
  for (double& x : values) x = rng.bernoulli(0.1) ? 0.0 : rng.uniform(-2, 2);
  const Tensor base = Tensor::from_vector(phys, values, dt);
  const int d = static_cast<int>(r);
  switch (layout) {
    case 1:
      return base.transpose(d - 3, d - 2);
    case 2:
      return base.slice(d - 1, 1, 1 + shape[r - 1]);
    case 3:
      return base.slice(d - 2, 0, phys[r - 2], 2);
    case 4:
    case 6:
      return base.expand(shape);
    case 5:
      return base.slice(d - 1, 0, phys[r - 1], 2);
    default:
      return base;
  }
}

// Row-major multi-index of flat index `flat` over `shape`.
inline std::vector<int64_t> unflatten(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return idx;
}

// Pads `t` with leading size-1 dims and broadcasts it to `full` (a view).
inline Tensor broadcast_view(const Tensor& t, const Shape& full) {
  Tensor p = t;
  while (p.dim() < static_cast<int>(full.size())) p = p.unsqueeze(0);
  return p.expand(full);
}

struct Case {
  DType dtype = DType::f32;
  Shape batch;
  int64_t B = 1, Hq = 1, Hkv = 1, Lq = 1, Lk = 1, D = 1, Dv = 1;
  Tensor q, k, v;
  AttentionOptions o;
  bool backward = false;
  uint64_t seed = 0;
  int threads_a = 1, threads_b = 2;
  std::string isa;  // the cpu backend's target for the automatic runs; "" = this CPU's choice
  bool amx_pipeline = false;  // on amx-emulated: the forward's tile products pipelined
  int poison = 0;  // 0 none, 1 NaN/inf in removed keys/values (or, by the seed, in one key
                   // some rows use: attention_poison.h), 2 NaN in one query row

  // Independent restatement of "which keys may row i of (b, h) use".
  Tensor mask_full, layout_full;  // broadcast views, undefined when absent
  std::vector<int64_t> key_len;   // [B]
  int64_t offset = 0, left = -1, right = -1;

  bool allowed(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t p = i + offset;
    if (left >= 0 && j < p - left) return false;
    if (right >= 0 && j > p + right) return false;
    if (!key_len.empty() && j >= key_len[b]) return false;
    std::vector<int64_t> idx = unflatten(b, batch);
    if (mask_full.defined()) {
      std::vector<int64_t> m = idx;
      m.insert(m.end(), {h, i, j});
      const double x = mask_full.at(m);
      if (o.mask_type == MaskType::keep && x == 0) return false;
      if (o.mask_type == MaskType::drop && x != 0) return false;
      if (o.mask_type == MaskType::add && x == -std::numeric_limits<double>::infinity())
        return false;
    }
    if (layout_full.defined()) {
      idx.insert(idx.end(), {h, i / o.block_layout.block_q, j / o.block_layout.block_k});
      if (layout_full.at(idx) == 0) return false;
    }
    return true;
  }
};

inline Shape with(const Shape& batch, std::initializer_list<int64_t> tail) {
  Shape s = batch;
  s.insert(s.end(), tail);
  return s;
}

inline Case make_case(ByteReader& in) {
  Case c;
  c.dtype = in.pick({DType::f32, DType::f64, DType::bf16, DType::f16, DType::f32});
  const int nb = static_cast<int>(in.range(0, 2));
  for (int d = 0; d < nb; ++d) c.batch.push_back(in.range(0, 4) == 0 ? 0 : in.range(1, 3));
  c.B = checked_numel(c.batch, "fuzz");
  c.Hkv = in.range(1, 3);
  c.Hq = c.Hkv * in.range(1, 3);
  c.Lq = in.range(0, 9);
  c.Lk = in.range(0, 11);
  c.D = in.range(1, 9);
  c.Dv = in.range(1, 9);
  Rng rng{in.u64()};
  c.q =
      make_input(rng, with(c.batch, {c.Hq, c.Lq, c.D}), c.dtype, static_cast<int>(in.range(0, 6)));
  c.k =
      make_input(rng, with(c.batch, {c.Hkv, c.Lk, c.D}), c.dtype, static_cast<int>(in.range(0, 6)));
  c.v = make_input(rng, with(c.batch, {c.Hkv, c.Lk, c.Dv}), c.dtype,
                   static_cast<int>(in.range(0, 6)));

  AttentionOptions& o = c.o;
  const uint8_t opts = in.byte();
  if (opts & 1) o.scale = in.pick({0.05, 0.5, 1.0, 3.0, 0.0, -0.7});
  if (opts & 2) o.softcap = in.pick({0.5, 2.0, 30.0});
  o.causal = (opts & 4) != 0;
  o.align = (opts & 8) ? Align::top_left : Align::bottom_right;
  if (opts & 16) o.position_offset = in.range(-4, 6);
  if (opts & 32) {
    o.window.left = in.range(-1, 4);
    o.window.right = in.range(-1, 4);
  }
  const uint8_t more = in.byte();
  const Shape full = with(c.batch, {c.Hq, c.Lq, c.Lk});
  if (more & 1) {  // dense mask: a random rank, each dim full or broadcast
    o.mask_type = in.pick({MaskType::keep, MaskType::drop, MaskType::add});
    const int rank = static_cast<int>(in.range(1, static_cast<int64_t>(full.size())));
    Shape ms(full.end() - rank, full.end());
    const uint8_t bcast = in.byte();
    for (int d = 0; d < rank; ++d)
      if (bcast >> d & 1) ms[d] = 1;
    const int64_t n = checked_numel(ms, "fuzz");
    std::vector<double> mv(static_cast<size_t>(n));
    for (double& x : mv) {
      if (o.mask_type == MaskType::add) {
        const double r = rng.uniform(0, 1);
        x = r < 0.25  ? -std::numeric_limits<double>::infinity()
            : r < 0.5 ? 0.0
                      : rng.uniform(-3, 3);
      } else {
        x = rng.bernoulli(0.7) ? 1.0 : 0.0;
      }
    }
    const DType mdt =
        o.mask_type == MaskType::add ? in.pick({DType::f32, DType::f64, c.dtype}) : DType::boolean;
    o.mask = Tensor::from_vector(ms, mv, mdt);
    c.mask_full = broadcast_view(o.mask, full);
  }
  if (more & 2) {
    std::vector<double> kl(static_cast<size_t>(c.B));
    for (double& x : kl) x = static_cast<double>(in.range(0, c.Lk));
    const Shape ks = (nb == 1 || in.flag()) ? Shape{c.B} : c.batch;
    o.key_lengths = Tensor::from_vector(ks, kl, in.flag() ? DType::i64 : DType::i32);
    for (double x : kl) c.key_len.push_back(static_cast<int64_t>(x));
  }
  if (more & 4) {
    BlockLayout& bl = o.block_layout;
    bl.block_q = in.range(1, 4);
    bl.block_k = in.range(1, 4);
    Shape ts = with(c.batch, {c.Hq, (c.Lq + bl.block_q - 1) / bl.block_q,
                              (c.Lk + bl.block_k - 1) / bl.block_k});
    const Shape tiles = ts;
    ts.erase(ts.begin(), ts.end() - 3);
    if (in.flag()) ts[0] = 1;
    std::vector<double> lv(static_cast<size_t>(checked_numel(ts, "fuzz")));
    for (double& x : lv) x = rng.bernoulli(0.75) ? 1.0 : 0.0;
    bl.layout = Tensor::from_vector(ts, lv, DType::boolean);
    c.layout_full = broadcast_view(bl.layout, tiles);
  }
  if (more & 8) {
    std::vector<double> sl(static_cast<size_t>(c.Hq));
    for (double& x : sl) x = rng.uniform(0, 1);
    o.alibi_slopes = Tensor::from_vector({c.Hq}, sl, in.flag() ? DType::f64 : DType::f32);
  }
  if (more & 16) {
    o.dropout_p = in.pick({0.1, 0.5, 0.9});
    o.seed = in.u64();
  }
  o.return_weights = (more & 32) != 0;
  c.backward = (more & 64) != 0;
  if (c.backward && o.mask.defined() && o.mask_type == MaskType::add) o.mask_grad = in.flag();
  c.threads_a = static_cast<int>(in.range(1, 4));
  c.threads_b = static_cast<int>(in.range(1, 7));
  c.poison = static_cast<int>(in.range(0, 2));
  c.seed = rng.next();
  // The automatic backend's target, drawn from the seed (no input byte: saved inputs keep their
  // meaning): this CPU's own choice half of the time, else one target forced (one this CPU cannot
  // run leaves its choice). Forcing avx512bf16 also runs bf16 on VDPBF16PS, which a sanitized
  // build's once-per-process probe (bf16_dot_pays) never picks: the instrumented probe loses.
  static constexpr const char* kIsas[] = {"",         "",     "",           "",
                                          "portable", "avx2", "avx512bf16", "amx-emulated"};
  c.isa = kIsas[Rng{c.seed ^ 0x6a09e667f3bcc909ull}.next() % 8];
  // On the emulated tiles, half of the cases pipeline the forward's products (amx_pipeline-inl.h).
  c.amx_pipeline =
      c.isa == std::string("amx-emulated") && Rng{c.seed ^ 0xbb67ae8584caa73bull}.next() % 2 == 1;

  c.offset =
      o.position_offset ? *o.position_offset : (o.align == Align::bottom_right ? c.Lk - c.Lq : 0);
  c.left = o.window.left;
  c.right = o.window.right;
  if (o.causal) c.right = c.right < 0 ? 0 : std::min<int64_t>(c.right, 0);
  return c;
}

inline double tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return 2e-5;
    case DType::f16:
      return 6e-3;
    default:
      return 4e-2;  // bf16: a unit in the last place is 2^-8
  }
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data(), cb.data(), static_cast<size_t>(ca.numel()) * ca.itemsize()) == 0;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

// |a - b| <= tol * (1 + max|ref|) elementwise; equal infinities and NaNs in the same places pass.
inline void require_close(const Tensor& a, const Tensor& ref, double tol, const std::string& what) {
  require(a.shape() == ref.shape(),
          what + ": shapes differ " + a.shape_str() + " vs " + ref.shape_str());
  const std::vector<double> x = a.to_vector(), y = ref.to_vector();
  double scale = 0;
  for (double e : y)
    if (std::isfinite(e)) scale = std::max(scale, std::fabs(e));
  const double bound = tol * (1 + scale);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      require(std::isnan(x[i]) && std::isnan(y[i]),
              fmt::format("{}: NaN mismatch at {}: {} vs {}", what, i, x[i], y[i]));
    } else if (std::isinf(x[i]) || std::isinf(y[i])) {
      require(x[i] == y[i], fmt::format("{}: inf mismatch at {}: {} vs {}", what, i, x[i], y[i]));
    } else {
      require(std::fabs(x[i] - y[i]) <= bound,
              fmt::format("{}: element {} differs: {} vs reference {} (bound {})", what, i, x[i],
                          y[i], bound));
    }
  }
}

inline AttentionResult forward(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v,
                               Backend backend, int threads) {
  AttentionOptions o = c.o;
  o.backend = backend;
  o.threads = threads;
  return attention(q, k, v, o);
}

inline void check_same(const AttentionResult& a, const AttentionResult& b,
                       const std::string& what) {
  require(bitwise_equal(a.out, b.out), what + ": out differs");
  require(bitwise_equal(a.lse, b.lse), what + ": lse differs");
  require(bitwise_equal(a.weights, b.weights), what + ": weights differ");
}

}  // namespace attn::fuzz::attention_detail
