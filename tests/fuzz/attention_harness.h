// Fuzz harness for attn::attention / attn::attention_backward: the input bytes pick a small problem
// (dtype, batch dims, heads, lengths, head dims, memory layouts, every option of the contract) and,
// half of the time, one deliberate defect. Invariants checked (docs/semantics.md):
//   - a defective call raises attn::Error whose message starts with the entry point's name; nothing
//   else
//     (another exception type, a crash, or silently returning) is allowed;
//   - a valid call succeeds on the reference and the automatic backend, with the documented shapes
//   and
//     dtypes, and the two agree within a dtype-sized tolerance (forward and backward);
//   - the automatic backend gives bitwise equal results for two different thread counts;
//   - weights are exactly 0 on removed keys and rows of allowed keys sum to 1; a row with no
//   allowed key has
//     out = 0, weights = 0, lse = -inf and dq = 0, never NaN; finite inputs give finite outputs;
//   - NaN/inf written into keys and values that every row removes changes nothing (bitwise);
//   - a NaN query row with an allowed key gives a NaN output row and leaves the other rows bitwise
//   equal.
// Which keys a row may use is recomputed here from the options, independently of src/contract.
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

namespace attn::fuzz {

namespace attention_detail {

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
// broadcast heads (stride 0), 5 last dim stride 2.
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
  int poison = 0;  // 0 none, 1 NaN/inf in removed keys/values, 2 NaN in one query row

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
      make_input(rng, with(c.batch, {c.Hq, c.Lq, c.D}), c.dtype, static_cast<int>(in.range(0, 5)));
  c.k =
      make_input(rng, with(c.batch, {c.Hkv, c.Lk, c.D}), c.dtype, static_cast<int>(in.range(0, 5)));
  c.v = make_input(rng, with(c.batch, {c.Hkv, c.Lk, c.Dv}), c.dtype,
                   static_cast<int>(in.range(0, 5)));

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

  c.offset =
      o.position_offset ? *o.position_offset : (o.align == Align::bottom_right ? c.Lk - c.Lq : 0);
  c.left = o.window.left;
  c.right = o.window.right;
  if (o.causal) c.right = c.right < 0 ? 0 : std::min<int64_t>(c.right, 0);
  return c;
}

// Applies one deliberate defect (chosen by `which`) to a valid case. Returns the entry point that
// must reject it: "attn::attention" or "attn::attention_backward".
inline const char* corrupt(Case& c, int which, ByteReader& in) {
  AttentionOptions& o = c.o;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  Rng rng{in.u64()};
  switch (which) {
    case 0:
      c.k = make_input(rng, with(c.batch, {c.Hkv, c.Lk, c.D + 1}), c.dtype, 0);
      break;  // head dim
    case 1:
      c.v = make_input(rng, with(c.batch, {c.Hkv, c.Lk + 1, c.Dv}), c.dtype, 0);
      break;  // length
    case 2:   // Hq not a multiple of Hkv
      c.k = make_input(rng, with(c.batch, {c.Hq + 1, c.Lk, c.D}), c.dtype, 0);
      c.v = make_input(rng, with(c.batch, {c.Hq + 1, c.Lk, c.Dv}), c.dtype, 0);
      break;
    case 3:
      c.k = c.k.to(c.dtype == DType::f32 ? DType::f64 : DType::f32);
      break;  // mixed dtypes
    case 4:
      c.q = make_input(rng, with(c.batch, {c.Hq, c.Lq, c.D}), DType::i32, 0);
      break;
    case 5:  // rank below 3, or ranks that differ
      c.q = in.flag() ? make_input(rng, {c.Lq, c.D}, c.dtype, 0)
                      : make_input(rng, with(c.batch, {1, c.Hq, c.Lq, c.D}), c.dtype, 0);
      break;
    case 6: {  // batch dims differ
      Shape b = c.batch;
      b.insert(b.begin(), 2);
      c.k = make_input(rng, with(b, {c.Hkv, c.Lk, c.D}), c.dtype, 0);
      break;
    }
    case 7:
      o.scale = in.pick({-inf, nan, inf});  // any finite scale is valid
      break;
    case 8:
      o.softcap = in.pick({0.0, -2.0, nan, inf});
      break;
    case 9:
      o.dropout_p = in.pick({1.5, -0.1, nan, 2.0});
      break;
    case 10:
      (in.flag() ? o.window.left : o.window.right) = -2 - in.range(0, 100);
      break;
    case 11: {  // key_lengths out of range or of a wrong dtype / shape
      std::vector<double> kl(static_cast<size_t>(std::max<int64_t>(c.B, 1)), 0.0);
      kl[0] = in.flag() ? -1.0 : static_cast<double>(c.Lk + 1);
      const int kind = static_cast<int>(in.range(0, 2));
      if (kind == 0)
        o.key_lengths = Tensor::from_vector({static_cast<int64_t>(kl.size())}, kl, DType::i64);
      if (kind == 1)
        o.key_lengths = Tensor::from_vector({static_cast<int64_t>(kl.size())}, kl, DType::f32);
      if (kind == 2) o.key_lengths = Tensor::zeros({c.B + 2}, DType::i32);
      break;
    }
    case 12: {  // mask of the wrong dtype for its polarity, or not broadcastable
      if (in.flag()) {
        o.mask_type = in.pick({MaskType::keep, MaskType::drop});
        o.mask = Tensor::zeros({c.Lq, c.Lk}, DType::f32);
      } else {
        o.mask_type = in.pick({MaskType::keep, MaskType::drop, MaskType::add});
        o.mask = Tensor::zeros({c.Lq, c.Lk + 2},
                               o.mask_type == MaskType::add ? DType::f32 : DType::boolean);
      }
      break;
    }
    case 13: {  // alibi: wrong length or non-finite
      const bool wrong_len = in.flag();
      std::vector<double> sl(static_cast<size_t>(c.Hq + (wrong_len ? 1 : 0)), 0.5);
      if (!wrong_len) sl[0] = in.flag() ? nan : inf;
      o.alibi_slopes = Tensor::from_vector({static_cast<int64_t>(sl.size())}, sl, DType::f32);
      break;
    }
    case 14: {  // block layout: bad block sizes or tile grid
      o.block_layout.block_q = in.flag() ? 0 : 1;
      o.block_layout.block_k = o.block_layout.block_q == 0 ? 1 : -in.range(0, 3);
      if (in.flag()) {
        o.block_layout.block_q = 1;
        o.block_layout.block_k = 1;
        o.block_layout.layout = Tensor::zeros({c.Lq + 2, c.Lk}, DType::boolean);
      } else {
        o.block_layout.layout = Tensor::zeros({1, 1}, DType::boolean);
      }
      break;
    }
    case 15:
      o.position_offset = in.flag() ? (int64_t{1} << 61) : std::numeric_limits<int64_t>::min();
      break;
    case 16: {  // the output's element count overflows int64 while q, k, v do not (broadcast views)
      const int64_t m = int64_t{1} << 20;
      c.q = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({m, m, m, 1});
      c.k = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({m, m, 1, 1});
      c.v = Tensor::zeros({1, 1, 1, 1024}, c.dtype).expand({m, m, 1, 1024});
      break;
    }
    case 17: {  // the weights' element count overflows int64 (Lq = Lk = 2^32), weights requested
      const int64_t l = int64_t{1} << 32;
      c.q = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({1, 1, l, 1});
      c.k = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({1, 1, l, 1});
      c.v = c.k;
      o.return_weights = true;
      break;
    }
    default:
      return "attn::attention_backward";  // the backward's own checks: handled by the caller
  }
  return "attn::attention";
}
inline constexpr int kForwardDefects = 18;  // cases 0..17; the backward defects are separate

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

// Checks one forward result against the independent mask rule: exact zeros where nothing is
// allowed, weights 0 on removed keys, rows summing to 1, finite values when the inputs are finite.
inline void check_rows(const Case& c, const AttentionResult& r, bool finite_inputs,
                       const char* name) {
  const std::vector<double> out = r.out.to_vector(), lse = r.lse.to_vector();
  const std::vector<double> w = r.weights.defined() ? r.weights.to_vector() : std::vector<double>{};
  const double sum_tol = static_cast<double>(c.Lk + 1) * (c.dtype == DType::bf16  ? 0x1p-8
                                                          : c.dtype == DType::f16 ? 0x1p-11
                                                                                  : 1e-6);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t i = 0; i < c.Lq; ++i) {
        const int64_t row = (b * c.Hq + h) * c.Lq + i;
        int64_t n_allowed = 0;
        double wsum = 0;
        for (int64_t j = 0; j < c.Lk; ++j) {
          const bool ok = c.allowed(b, h, i, j);
          n_allowed += ok;
          if (!w.empty()) {
            const double x = w[static_cast<size_t>(row * c.Lk + j)];
            if (!ok)
              require(x == 0, fmt::format("{}: weight of removed key ({}, {}, {}, {}) is {}", name,
                                          b, h, i, j, x));
            wsum += x;
          }
        }
        const double l = lse[static_cast<size_t>(row)];
        if (n_allowed == 0) {
          require(l == -std::numeric_limits<double>::infinity(),
                  fmt::format("{}: fully masked row ({}, {}, {}) has lse {}", name, b, h, i, l));
          for (int64_t e = 0; e < c.Dv; ++e) {
            const double x = out[static_cast<size_t>(row * c.Dv + e)];
            require(x == 0,
                    fmt::format("{}: fully masked row ({}, {}, {}) has out {}", name, b, h, i, x));
          }
          require(wsum == 0,
                  fmt::format("{}: fully masked row ({}, {}, {}) has weights", name, b, h, i));
        } else if (finite_inputs) {
          require(std::isfinite(l),
                  fmt::format("{}: row ({}, {}, {}) has lse {}", name, b, h, i, l));
          for (int64_t e = 0; e < c.Dv; ++e) {
            const double x = out[static_cast<size_t>(row * c.Dv + e)];
            require(std::isfinite(x),
                    fmt::format("{}: row ({}, {}, {}) has out {}", name, b, h, i, x));
          }
          if (!w.empty()) {
            require(std::fabs(wsum - 1) <= sum_tol,
                    fmt::format("{}: weights of row ({}, {}, {}) sum to {}", name, b, h, i, wsum));
          }
        }
      }
    }
  }
}

inline void check_same(const AttentionResult& a, const AttentionResult& b,
                       const std::string& what) {
  require(bitwise_equal(a.out, b.out), what + ": out differs");
  require(bitwise_equal(a.lse, b.lse), what + ": lse differs");
  require(bitwise_equal(a.weights, b.weights), what + ": weights differ");
}

// NaN/inf into every key/value row that no query row may use (a removed key never touches the
// output). Returns false when there is no such key.
inline bool poison_removed_keys(const Case& c, Tensor& k, Tensor& v) {
  k = k.clone();
  v = v.clone();
  bool any = false;
  const int64_t group = c.Hq / c.Hkv;
  for (int64_t b = 0; b < c.B; ++b) {
    const std::vector<int64_t> bi = unflatten(b, c.batch);
    for (int64_t hk = 0; hk < c.Hkv; ++hk) {
      for (int64_t j = 0; j < c.Lk; ++j) {
        bool used = false;
        for (int64_t h = hk * group; h < (hk + 1) * group && !used; ++h)
          for (int64_t i = 0; i < c.Lq && !used; ++i) used = c.allowed(b, h, i, j);
        if (used) continue;
        any = true;
        std::vector<int64_t> idx = bi;
        idx.insert(idx.end(), {hk, j, 0});
        for (int64_t e = 0; e < c.D; ++e) {
          idx.back() = e;
          k.set(idx, e % 2 ? std::numeric_limits<double>::quiet_NaN()
                           : -std::numeric_limits<double>::infinity());
        }
        for (int64_t e = 0; e < c.Dv; ++e) {
          idx.back() = e;
          v.set(idx, e % 2 ? std::numeric_limits<double>::infinity()
                           : std::numeric_limits<double>::quiet_NaN());
        }
      }
    }
  }
  return any;
}

inline void check_valid(const Case& c) {
  const Shape out_shape = with(c.batch, {c.Hq, c.Lq, c.Dv}),
              lse_shape = with(c.batch, {c.Hq, c.Lq});
  const DType lse_dtype = c.dtype == DType::f64 ? DType::f64 : DType::f32;
  const AttentionResult ref = forward(c, c.q, c.k, c.v, Backend::reference, c.threads_a);
  const AttentionResult fast = forward(c, c.q, c.k, c.v, Backend::automatic, c.threads_a);
  for (const AttentionResult* r : {&ref, &fast}) {
    require(r->out.shape() == out_shape && r->out.dtype() == c.dtype,
            "out has the wrong shape or dtype");
    require(r->lse.shape() == lse_shape && r->lse.dtype() == lse_dtype,
            "lse has the wrong shape or dtype");
    require(r->weights.defined() == c.o.return_weights,
            "weights returned without being asked or missing");
    if (c.o.return_weights) {
      require(r->weights.shape() == with(c.batch, {c.Hq, c.Lq, c.Lk}),
              "weights have the wrong shape");
    }
  }
  check_rows(c, ref, true, "reference");
  check_rows(c, fast, true, "auto");
  const double tol = tolerance(c.dtype) / (1 - c.o.dropout_p);
  require_close(fast.out, ref.out, tol, "auto vs reference: out");
  require_close(fast.lse, ref.lse, tolerance(c.dtype), "auto vs reference: lse");
  if (c.o.return_weights)
    require_close(fast.weights, ref.weights, tolerance(c.dtype), "auto vs reference: weights");
  check_same(fast, forward(c, c.q, c.k, c.v, Backend::automatic, c.threads_b),
             fmt::format("auto with {} vs {} threads", c.threads_a, c.threads_b));

  if (c.poison == 1) {
    Tensor k = c.k, v = c.v;
    if (poison_removed_keys(c, k, v)) {
      check_same(ref, forward(c, c.q, k, v, Backend::reference, c.threads_a),
                 "reference with NaN/inf in removed keys");
      check_same(fast, forward(c, c.q, k, v, Backend::automatic, c.threads_a),
                 "auto with NaN/inf in removed keys");
    }
  } else if (c.poison == 2 && c.o.dropout_p == 0 && c.B > 0 && c.Lq > 0) {
    // A NaN query row: its output is NaN wherever the row has an allowed key; other rows are
    // unchanged.
    Tensor q = c.q.clone();
    std::vector<int64_t> idx(static_cast<size_t>(q.dim()), 0);
    idx[idx.size() - 2] = c.Lq - 1;
    q.set(idx, std::numeric_limits<double>::quiet_NaN());
    for (Backend be : {Backend::reference, Backend::automatic}) {
      const AttentionResult base = be == Backend::reference ? ref : fast;
      const AttentionResult r = forward(c, q, c.k, c.v, be, c.threads_a);
      const std::vector<double> o0 = base.out.to_vector(), o1 = r.out.to_vector();
      const int64_t poisoned_row = c.Lq - 1;  // of (b = 0, h = 0)
      bool has_allowed = false;
      for (int64_t j = 0; j < c.Lk; ++j)
        has_allowed = has_allowed || c.allowed(0, 0, poisoned_row, j);
      for (size_t e = 0; e < o1.size(); ++e) {
        const bool in_row = static_cast<int64_t>(e) / c.Dv == poisoned_row;
        if (in_row && has_allowed) {
          require(std::isnan(o1[e]),
                  fmt::format("{}: NaN query row gave out {}", backend_name(be), o1[e]));
        } else {
          require(std::memcmp(&o0[e], &o1[e], sizeof(double)) == 0,
                  fmt::format("{}: a NaN in another query row changed out[{}]: {} -> {}",
                              backend_name(be), e, o0[e], o1[e]));
        }
      }
    }
  }

  if (!c.backward) return;
  Rng rng{c.seed};
  const Tensor dout = make_input(rng, out_shape, c.dtype, 0);
  AttentionOptions o = c.o;
  o.backend = Backend::reference;
  o.threads = c.threads_a;
  const AttentionGrads gref = attention_backward(dout, c.q, c.k, c.v, ref.out, ref.lse, o);
  o.backend = Backend::automatic;
  const AttentionGrads gfast = attention_backward(dout, c.q, c.k, c.v, fast.out, fast.lse, o);
  o.threads = c.threads_b;
  const AttentionGrads gfast2 = attention_backward(dout, c.q, c.k, c.v, fast.out, fast.lse, o);
  const std::string threads =
      fmt::format("backward with {} vs {} threads", c.threads_a, c.threads_b);
  require(bitwise_equal(gfast.dq, gfast2.dq) && bitwise_equal(gfast.dk, gfast2.dk) &&
              bitwise_equal(gfast.dv, gfast2.dv) && bitwise_equal(gfast.dmask, gfast2.dmask),
          threads + ": gradients differ");
  for (const AttentionGrads* g : {&gref, &gfast}) {
    require(g->dq.shape() == c.q.shape() && g->dk.shape() == c.k.shape() &&
                g->dv.shape() == c.v.shape(),
            "gradients have the wrong shapes");
    require(g->dmask.defined() == c.o.mask_grad, "dmask returned without being asked or missing");
    if (c.o.mask_grad)
      require(g->dmask.shape() == c.o.mask.shape(), "dmask does not have the mask's shape");
    for (const Tensor* t : {&g->dq, &g->dk, &g->dv}) {
      for (double x : t->to_vector())
        require(std::isfinite(x), "a gradient is not finite for finite inputs");
    }
    // dq of a row with no allowed key is 0.
    const std::vector<double> dq = g->dq.contiguous().to_vector();
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Lq; ++i) {
          bool any = false;
          for (int64_t j = 0; j < c.Lk && !any; ++j) any = c.allowed(b, h, i, j);
          if (any) continue;
          for (int64_t e = 0; e < c.D; ++e) {
            const double x = dq[static_cast<size_t>(((b * c.Hq + h) * c.Lq + i) * c.D + e)];
            require(x == 0, fmt::format("dq of fully masked row ({}, {}, {}) is {}", b, h, i, x));
          }
        }
  }
  // Gradients are sums over rows and heads: allow the tolerance per summed term.
  const double gtol = 4 * tolerance(c.dtype) / (1 - c.o.dropout_p);
  require_close(gfast.dq, gref.dq, gtol, "auto vs reference: dq");
  require_close(gfast.dk, gref.dk, gtol, "auto vs reference: dk");
  require_close(gfast.dv, gref.dv, gtol, "auto vs reference: dv");
  if (c.o.mask_grad) require_close(gfast.dmask, gref.dmask, gtol, "auto vs reference: dmask");
}

// Calls `fn` expecting attn::Error from `entry`; anything else is a violation.
template <class Fn>
void expect_rejected(const char* entry, const std::string& defect, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    require(starts_with(e.what(), entry),
            fmt::format("{}: the message for {} does not start with the entry point: {}", entry,
                        defect, e.what()));
    return;
  }
  violation(fmt::format("{} accepted a defective call ({})", entry, defect));
}

}  // namespace attention_detail

inline void fuzz_attention(const uint8_t* data, size_t size) {
  using namespace attention_detail;
  ByteReader in(data, size);
  const uint8_t mode = in.byte();
  Case c = make_case(in);
  if (mode % 2 == 0) {
    check_valid(c);
    return;
  }
  const int defect = static_cast<int>(in.range(0, kForwardDefects + 2));
  if (defect < kForwardDefects) {
    corrupt(c, defect, in);
    expect_rejected("attn::attention", fmt::format("defect {}", defect), [&] {
      forward(c, c.q, c.k, c.v, in.flag() ? Backend::reference : Backend::automatic, 1);
    });
    return;
  }
  // Backward defects: wrong shapes of dout / out / lse, or mask_grad without an add mask.
  AttentionOptions o = c.o;
  o.dropout_p = 0;
  o.threads = 1;
  const AttentionResult r = attention(c.q, c.k, c.v, o);
  Tensor dout = r.out, out = r.out, lse = r.lse;
  const int which = static_cast<int>(in.range(0, 3));
  if (which == 0) dout = Tensor::zeros(with(c.batch, {c.Hq, c.Lq, c.Dv + 1}), c.dtype);
  if (which == 1) out = Tensor::zeros(with(c.batch, {c.Hq, c.Lq + 1, c.Dv}), c.dtype);
  if (which == 2) lse = Tensor::zeros(with(c.batch, {c.Hq + 1, c.Lq}), DType::f32);
  if (which == 3) {
    o.mask_grad = true;
    if (o.mask.defined() && o.mask_type == MaskType::add) o.mask = Tensor();
  }
  expect_rejected("attn::attention_backward", fmt::format("backward defect {}", which),
                  [&] { attention_backward(dout, c.q, c.k, c.v, out, lse, o); });
}

}  // namespace attn::fuzz
