// An independent, naive implementation of the attention contract for cross-checks, written
// differently from src/backends/reference on purpose so that the two catch each other's mistakes:
//   - it takes the user's tensors and AttentionOptions (any number of leading batch dims, any
//   layout) and
//     does its own broadcasting with Tensor::expand + to_vector, not the canonical 4-D problem;
//   - it materialises the full score matrix S [Lq, Lk] and a separate allowed matrix A [Lq, Lk] per
//     (batch, head), with causal and the window checked as separate rules (not the folded
//     PositionRule);
//   - dropout calls Philox4x32 directly from the layout documented in contract/dropout.h;
//   - the backward recomputes P itself and uses D_i = sum_j P_ij dP_ij (not dO.O).
// Everything is double; outputs are f64 tensors in the user's shapes. Slow: for small test problems
// only.
#pragma once
#include <Random123/philox.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/attention.h"

namespace attn::test {

struct NaiveResult {
  Tensor out;      // [..., Hq, Lq, Dv] f64
  Tensor lse;      // [..., Hq, Lq] f64
  Tensor weights;  // [..., Hq, Lq, Lk] f64, before dropout
};
struct NaiveGrads {
  Tensor dq, dk, dv;  // f64, shapes of q, k, v
  Tensor dmask;       // f64, the mask's shape (when the mask is of type add)
  Tensor dsinks;      // f64 [Hq] (when the options have sinks)
};

namespace naive_detail {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The dropout draw of (b, h, i, j) straight from the Philox layout: counter (j / 4, i, h, b), key =
// seed.
inline bool dropout_keeps(double p, uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p <= 0.0) return true;
  r123::Philox4x32 philox;
  const r123::Philox4x32::ctr_type ctr = {{static_cast<uint32_t>(j / 4), static_cast<uint32_t>(i),
                                           static_cast<uint32_t>(h), static_cast<uint32_t>(b)}};
  const r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(seed & 0xffffffffu), static_cast<uint32_t>(seed >> 32)}};
  const uint32_t draw = philox(ctr, key).v[j % 4];
  const double threshold = std::min(std::floor(p * 4294967296.0), 4294967295.0);
  return static_cast<double>(draw) >= threshold;
}

// Values of `t` broadcast to `full` (NumPy rules), row-major.
inline std::vector<double> broadcast_values(const Tensor& t, const Shape& full) {
  Tensor x = t;
  while (x.dim() < static_cast<int>(full.size())) x = x.unsqueeze(0);
  return x.expand(full).to_vector();
}

// Everything the forward and the backward need for one problem, flattened to batch index b in [0,
// B).
struct Problem {
  int64_t B = 1, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  Shape batch;
  std::vector<double> q, k, v;  // row-major [B, H, L, D]
  std::vector<double> mask;     // [B, Hq, Lq, Lk] broadcast values, empty = none
  std::vector<double> layout;   // [B, Hq, nI, nJ], empty = none
  int64_t nI = 0, nJ = 0;
  std::vector<double> key_len;  // [B], empty = none
  std::vector<double> alibi;    // [Hq]
  double scale = 1.0;
};

inline Problem setup(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  Problem P;
  const int r = q.dim();
  P.batch = Shape(q.shape().begin(), q.shape().end() - 3);
  for (int64_t s : P.batch) P.B *= s;
  P.Hq = q.size(r - 3), P.Lq = q.size(r - 2), P.D = q.size(r - 1);
  P.Hkv = k.size(r - 3), P.Lk = k.size(r - 2), P.Dv = v.size(r - 1);
  P.q = q.to_vector(), P.k = k.to_vector(), P.v = v.to_vector();
  Shape full = P.batch;
  full.insert(full.end(), {P.Hq, P.Lq, P.Lk});
  if (o.mask.defined()) P.mask = broadcast_values(o.mask, full);
  if (o.block_layout.layout.defined()) {
    P.nI = (P.Lq + o.block_layout.block_q - 1) / o.block_layout.block_q;
    P.nJ = (P.Lk + o.block_layout.block_k - 1) / o.block_layout.block_k;
    Shape tiles = P.batch;
    tiles.insert(tiles.end(), {P.Hq, P.nI, P.nJ});
    P.layout = broadcast_values(o.block_layout.layout, tiles);
  }
  if (o.key_lengths.defined()) P.key_len = o.key_lengths.to_vector();
  if (o.alibi_slopes.defined()) P.alibi = o.alibi_slopes.to_vector();
  P.scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(P.D));
  return P;
}

// S, A and the softcap slope of one (b, h): A[i][j] = key j is usable by query i.
struct Scores {
  std::vector<std::vector<double>> S, capslope;
  std::vector<std::vector<bool>> A;
};

inline Scores scores(const Problem& P, const AttentionOptions& o, int64_t b, int64_t h) {
  Scores sc;
  sc.S.assign(P.Lq, std::vector<double>(P.Lk, 0.0));
  sc.capslope.assign(P.Lq, std::vector<double>(P.Lk, 1.0));
  sc.A.assign(P.Lq, std::vector<bool>(P.Lk, true));
  const int64_t g = h / (P.Hq / P.Hkv);
  for (int64_t i = 0; i < P.Lq; ++i) {
    const int64_t pos = o.align == Align::top_left ? i : i + (P.Lk - P.Lq);
    for (int64_t j = 0; j < P.Lk; ++j) {
      bool ok = true;
      if (o.causal && j > pos) ok = false;
      if (o.window.left >= 0 && j < pos - o.window.left) ok = false;
      if (o.window.right >= 0 && j > pos + o.window.right) ok = false;
      if (!P.key_len.empty() && j >= static_cast<int64_t>(P.key_len[P.key_len.size() == 1 ? 0 : b]))
        ok = false;
      const size_t m = static_cast<size_t>(((b * P.Hq + h) * P.Lq + i) * P.Lk + j);
      if (!P.mask.empty()) {
        if (o.mask_type == MaskType::keep && P.mask[m] == 0.0) ok = false;
        if (o.mask_type == MaskType::drop && P.mask[m] != 0.0) ok = false;
        if (o.mask_type == MaskType::add && P.mask[m] == -kInf) ok = false;
      }
      if (!P.layout.empty()) {
        const int64_t I = i / o.block_layout.block_q, J = j / o.block_layout.block_k;
        if (P.layout[static_cast<size_t>(((b * P.Hq + h) * P.nI + I) * P.nJ + J)] == 0.0)
          ok = false;
      }
      sc.A[i][j] = ok;
      if (!ok) continue;
      double dot = 0.0;
      for (int64_t d = 0; d < P.D; ++d) {
        dot += P.q[static_cast<size_t>(((b * P.Hq + h) * P.Lq + i) * P.D + d)] *
               P.k[static_cast<size_t>(((b * P.Hkv + g) * P.Lk + j) * P.D + d)];
      }
      double s = P.scale * dot;
      if (o.softcap) {
        s = *o.softcap * std::tanh(s / *o.softcap);
        sc.capslope[i][j] = 1.0 - (s / *o.softcap) * (s / *o.softcap);
      }
      if (!P.alibi.empty()) s -= P.alibi[h] * std::abs(static_cast<double>(pos - j));
      if (!P.mask.empty() && o.mask_type == MaskType::add) s += P.mask[m];
      sc.S[i][j] = s;
    }
  }
  return sc;
}

// Softmax of row i over its allowed keys and the sink logit (-inf: none), which joins the
// denominator and is not among the returned weights; all zero (and lse -inf) when neither an
// allowed key nor the sink has a finite score.
inline std::vector<double> softmax_row(const Scores& sc, int64_t i, double sink, double* lse) {
  const size_t n = sc.S[i].size();
  std::vector<double> p(n, 0.0);
  double mx = sink;
  for (size_t j = 0; j < n; ++j) {
    if (sc.A[i][j]) mx = std::max(mx, sc.S[i][j]);
  }
  *lse = -kInf;
  if (mx == -kInf) return p;  // nothing allowed: the empty sum
  double total = std::exp(sink - mx);
  for (size_t j = 0; j < n; ++j) {
    if (sc.A[i][j]) total += (p[j] = std::exp(sc.S[i][j] - mx));
  }
  for (double& x : p) x /= total;
  *lse = mx + std::log(total);
  return p;
}

// The sink logit of head h, -inf without sinks.
inline double sink_of(const AttentionOptions& o, int64_t h) {
  return o.sinks.defined() ? o.sinks.to_vector()[static_cast<size_t>(h)] : -kInf;
}

inline Shape with_tail(const Shape& batch, std::initializer_list<int64_t> tail) {
  Shape s = batch;
  s.insert(s.end(), tail);
  return s;
}

}  // namespace naive_detail

inline NaiveResult naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionOptions& o) {
  using namespace naive_detail;
  const Problem P = setup(q, k, v, o);
  std::vector<double> out(static_cast<size_t>(P.B * P.Hq * P.Lq * P.Dv), 0.0);
  std::vector<double> lse(static_cast<size_t>(P.B * P.Hq * P.Lq), -kInf);
  std::vector<double> w(static_cast<size_t>(P.B * P.Hq * P.Lq * P.Lk), 0.0);
  for (int64_t b = 0; b < P.B; ++b) {
    for (int64_t h = 0; h < P.Hq; ++h) {
      const int64_t g = h / (P.Hq / P.Hkv);
      const Scores sc = scores(P, o, b, h);
      for (int64_t i = 0; i < P.Lq; ++i) {
        const size_t row = static_cast<size_t>((b * P.Hq + h) * P.Lq + i);
        const std::vector<double> p = softmax_row(sc, i, sink_of(o, h), &lse[row]);
        for (int64_t j = 0; j < P.Lk; ++j) {
          w[row * P.Lk + j] = p[j];
          if (p[j] == 0.0 || !dropout_keeps(o.dropout_p, o.seed, b, h, i, j)) continue;
          const double pj = p[j] / (1.0 - o.dropout_p);
          for (int64_t d = 0; d < P.Dv; ++d) {
            out[row * P.Dv + d] +=
                pj * P.v[static_cast<size_t>(((b * P.Hkv + g) * P.Lk + j) * P.Dv + d)];
          }
        }
      }
    }
  }
  NaiveResult r;
  r.out = Tensor::from_vector(with_tail(P.batch, {P.Hq, P.Lq, P.Dv}), out, DType::f64);
  r.lse = Tensor::from_vector(with_tail(P.batch, {P.Hq, P.Lq}), lse, DType::f64);
  r.weights = Tensor::from_vector(with_tail(P.batch, {P.Hq, P.Lq, P.Lk}), w, DType::f64);
  return r;
}

// Gradients of L = <dout, naive_attention(q, k, v, o).out>.
inline NaiveGrads naive_attention_backward(const Tensor& dout_t, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const AttentionOptions& o) {
  using namespace naive_detail;
  const Problem P = setup(q, k, v, o);
  const std::vector<double> dout = dout_t.to_vector();
  std::vector<double> dq(P.q.size(), 0.0), dk(P.k.size(), 0.0), dv(P.v.size(), 0.0);
  std::vector<double> dS_full(static_cast<size_t>(P.B * P.Hq * P.Lq * P.Lk), 0.0);
  std::vector<double> dsinks(static_cast<size_t>(P.Hq), 0.0);
  const double keep_scale = 1.0 / (1.0 - o.dropout_p);
  for (int64_t b = 0; b < P.B; ++b) {
    for (int64_t h = 0; h < P.Hq; ++h) {
      const int64_t g = h / (P.Hq / P.Hkv);
      const Scores sc = scores(P, o, b, h);
      for (int64_t i = 0; i < P.Lq; ++i) {
        const size_t row = static_cast<size_t>((b * P.Hq + h) * P.Lq + i);
        double lse;
        const std::vector<double> p = softmax_row(sc, i, sink_of(o, h), &lse);
        std::vector<double> dP(P.Lk, 0.0);
        double Di = 0.0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j < P.Lk; ++j) {
          if (p[j] == 0.0 || !dropout_keeps(o.dropout_p, o.seed, b, h, i, j)) continue;
          const size_t vrow = static_cast<size_t>((b * P.Hkv + g) * P.Lk + j);
          for (int64_t d = 0; d < P.Dv; ++d) {
            dP[j] += keep_scale * dout[row * P.Dv + d] * P.v[vrow * P.Dv + d];
            dv[vrow * P.Dv + d] += p[j] * keep_scale * dout[row * P.Dv + d];
          }
          Di += p[j] * dP[j];
        }
        // The sink's weight exp(sink - lse) has dP = 0: its dS is -P_sink Di.
        if (o.sinks.defined() && lse != -kInf) dsinks[h] -= std::exp(sink_of(o, h) - lse) * Di;
        for (int64_t j = 0; j < P.Lk; ++j) {
          if (p[j] == 0.0) continue;
          const double dS = p[j] * (dP[j] - Di);
          dS_full[row * P.Lk + j] = dS;
          const double dRaw = dS * sc.capslope[i][j] * P.scale;
          const size_t krow = static_cast<size_t>((b * P.Hkv + g) * P.Lk + j);
          for (int64_t d = 0; d < P.D; ++d) {
            dq[row * P.D + d] += dRaw * P.k[krow * P.D + d];
            dk[krow * P.D + d] += dRaw * P.q[row * P.D + d];
          }
        }
      }
    }
  }
  NaiveGrads gr;
  gr.dq = Tensor::from_vector(q.shape(), dq, DType::f64);
  gr.dk = Tensor::from_vector(k.shape(), dk, DType::f64);
  gr.dv = Tensor::from_vector(v.shape(), dv, DType::f64);
  if (o.sinks.defined()) gr.dsinks = Tensor::from_vector({P.Hq}, dsinks, DType::f64);
  if (o.mask.defined() && o.mask_type == MaskType::add) {
    // Sum dS over every dim the mask was broadcast along: accumulate into a mask-shaped buffer
    // through a stride-0 view of it.
    const Shape full = with_tail(P.batch, {P.Hq, P.Lq, P.Lk});
    Tensor acc = Tensor::zeros(o.mask.shape(), DType::f64);
    Tensor view = acc;
    while (view.dim() < static_cast<int>(full.size())) view = view.unsqueeze(0);
    view = view.expand(full);
    std::vector<int64_t> idx(full.size(), 0);
    for (double x : dS_full) {
      int64_t off = 0;
      for (size_t d = 0; d < full.size(); ++d) off += idx[d] * view.stride(static_cast<int>(d));
      acc.data_as<double>()[off] += x;
      for (int d = static_cast<int>(full.size()) - 1; d >= 0; --d) {
        if (++idx[d] < full[d]) break;
        idx[d] = 0;
      }
    }
    gr.dmask = acc;
  }
  return gr;
}

}  // namespace attn::test
