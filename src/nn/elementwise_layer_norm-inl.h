// LayerNorm's row kernels, part of elementwise-inl.h (included by it after its vector helpers, with
// the same ATTN_EW_ISA and target pragma): no headers of its own.
#ifndef ATTN_EW_ISA
#error "included by elementwise-inl.h only"
#endif

namespace attn::nn::ew::ATTN_EW_ISA {
namespace {

// xhat of one vector of s, the row's mean as two floats: the forward and the backward both compute
// it here, so the backward's recomputed xhat is the forward's bit for bit.
inline vf normalized(vf s, float m_hi, float m_lo, float rstd) {
  return ((s - m_hi) - m_lo) * rstd;
}

// The sum of term(i) (a vector of doubles) over i = 0, W, ..., n - W (n a multiple of W), in four
// independent chains combined in a fixed order: one chain waited on each add's latency (the row
// statistics ran at half the rate of the loads).
template <class Term>
vd sum_chains(int64_t n, Term term) {
  vd a[4] = {};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) a[k] += term(i + k * W);
  }
  for (; i < n; i += W) a[0] += term(i);
  return (a[0] + a[1]) + (a[2] + a[3]);
}

void layer_norm_forward_rows(const LayerNormForward& p, int64_t r0, int64_t r1, float* stage,
                             double* sd) {
  const int64_t d = p.d, dv = d / W * W;
  for (int64_t n = r0; n < r1; ++n) {
    const float* xr = p.x16 ? stage : p.x + n * d;
    if (p.x16) widen_row(p.x16 + n * d, stage, d);
    const float* rr = p.r16 ? stage + d : p.r ? p.r + n * d : nullptr;
    if (p.r16) widen_row(p.r16 + n * d, stage + d, d);
    float* yr = p.y16 ? stage + 2 * d : p.y + n * d;
    // s = x + r (kept in y until the last pass), its sum in double; s in double kept in sd for the
    // variance (the conversion bounded both passes on a Zen 1, whose converts issue every 2 cycles).
    const vd acc = sum_chains(dv, [&](int64_t i) {
      vf s = load(xr + i);
      if (rr) {
        s += load(rr + i);
        store(yr + i, s);
      }
      const vd sv = to_double(s);
      std::memcpy(sd + i, &sv, sizeof sv);
      return sv;
    });
    double sum = 0;
    for (int64_t i = dv; i < d; ++i) {
      const float s = rr ? xr[i] + rr[i] : xr[i];
      if (rr) yr[i] = s;
      sum += s;
    }
    const float* sr = rr ? yr : xr;
    const double mean = (hsum(acc) + sum) / static_cast<double>(d);
    const vd acc2 = sum_chains(dv, [&](int64_t i) {
      vd sv;
      std::memcpy(&sv, sd + i, sizeof sv);
      const vd c = sv - mean;
      return c * c;
    });
    double sum2 = 0;
    for (int64_t i = dv; i < d; ++i) sum2 += (sr[i] - mean) * (sr[i] - mean);
    const double var = (hsum(acc2) + sum2) / static_cast<double>(d);
    const float rstd = static_cast<float>(1.0 / std::sqrt(var + p.eps));
    // (s - mean) with mean as two floats: s - m_hi is exact where it matters (s near the mean).
    const float m_hi = static_cast<float>(mean);
    const float m_lo = static_cast<float>(mean - m_hi);
    if (p.stats) {
      p.stats[3 * n] = m_hi;
      p.stats[3 * n + 1] = m_lo;
      p.stats[3 * n + 2] = rstd;
    }
    auto affine = [&](vf s, vf w, vf b) { return normalized(s, m_hi, m_lo, rstd) * w + b; };
    const vf one = splat(1.0f);
    int64_t i = 0;
    if (p.w && p.b) {  // the usual case, without the tests in the loop (GCC keeps them there)
      for (; i < dv; i += W) store(yr + i, affine(load(sr + i), load(p.w + i), load(p.b + i)));
    } else {
      for (; i < dv; i += W)
        store(yr + i, affine(load(sr + i), p.w ? load(p.w + i) : one, p.b ? load(p.b + i) : vf{}));
    }
    if (i < d) {
      float bs[W] = {}, bw[W] = {}, bb[W] = {};
      const size_t bytes = static_cast<size_t>(d - i) * sizeof(float);
      std::memcpy(bs, sr + i, bytes);
      if (p.w) std::memcpy(bw, p.w + i, bytes);
      if (p.b) std::memcpy(bb, p.b + i, bytes);
      const vf y = affine(load(bs), p.w ? load(bw) : one, load(bb));
      std::memcpy(yr + i, &y, bytes);
    }
    if (p.y16) round_row(yr, p.y16 + n * d, d);
  }
}

// One row's gradient vectors at i (full vector) or through zero-padded buffers at the tail (there
// g is 0, so the padded lanes add nothing to the sums).
struct BackRow {
  const LayerNormBackward& p;
  const float* g1;
  const float* g2;
  const float* x;  // the forward's s = x (+ r) from these
  const float* r;
  float m_hi, m_lo, rstd;
  vf load_at(const float* q, int64_t i, int64_t m) const {
    if (m == W) return load(q + i);
    float b[W] = {};
    std::memcpy(b, q + i, static_cast<size_t>(m) * sizeof(float));
    return load(b);
  }
  vf g(int64_t i, int64_t m) const {
    return g2 ? load_at(g1, i, m) + load_at(g2, i, m) : load_at(g1, i, m);
  }
  vf w(int64_t i, int64_t m) const { return p.w ? load_at(p.w, i, m) : splat(1.0f); }
  vf h(int64_t i, int64_t m) const {
    const vf s = r ? load_at(x, i, m) + load_at(r, i, m) : load_at(x, i, m);
    return normalized(s, m_hi, m_lo, rstd);
  }
};

inline void add_to(float* q, int64_t i, int64_t m, vf v) {
  if (m == W) {
    store(q + i, load(q + i) + v);
    return;
  }
  for (int64_t l = 0; l < m; ++l) q[i + l] += v[l];
}

void layer_norm_backward_rows(const LayerNormBackward& p, int64_t r0, int64_t r1, float* dw_part,
                              float* db_part, float* stage) {
  const int64_t d = p.d;
  for (int64_t n = r0; n < r1; ++n) {
    const float* xr = p.x16 ? stage : p.x + n * d;
    if (p.x16) widen_row(p.x16 + n * d, stage, d);
    const float* rr = p.r16 ? stage + d : p.r ? p.r + n * d : nullptr;
    if (p.r16) widen_row(p.r16 + n * d, stage + d, d);
    const float* st = p.stats + 3 * n;
    const BackRow row{p,     p.dy + n * d, p.dy2 ? p.dy2 + n * d : nullptr, xr, rr, st[0],
                      st[1], st[2]};
    vd s1{}, s2{};
    for (int64_t i = 0; i < d; i += W) {
      const int64_t m = d - i < W ? d - i : W;
      const vf g = row.g(i, m);
      const vf h = row.h(i, m);
      const vf dh = g * row.w(i, m);
      s1 += to_double(dh);
      s2 += to_double(dh) * to_double(h);
      if (dw_part) add_to(dw_part, i, m, g * h);
      if (db_part) add_to(db_part, i, m, g);
    }
    const float mean_dh = static_cast<float>(hsum(s1) / static_cast<double>(d));
    const float mean_dhh = static_cast<float>(hsum(s2) / static_cast<double>(d));
    float* dxr = p.dx + n * d;
    for (int64_t i = 0; i < d; i += W) {
      const int64_t m = d - i < W ? d - i : W;
      const vf dh = row.g(i, m) * row.w(i, m);
      const vf h = row.h(i, m);
      const vf dx = ((dh - mean_dh) - h * mean_dhh) * row.rstd;
      if (m == W) {
        store(dxr + i, dx);
      } else {
        std::memcpy(dxr + i, &dx, static_cast<size_t>(m) * sizeof(float));
      }
    }
  }
}

}  // namespace
}  // namespace attn::nn::ew::ATTN_EW_ISA
