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

// The forward works on whole registers of floats (vw): on AVX-512 a LayerNorm row ran at ~2 cycles
// per element on the half-register vf steps. Each register splits into two vf halves for the double
// statistics, which keeps their order of summation (and the results' bits).

// s = x (+ r) of one row, from f32 or bf16 rows (widened as they are read).
struct LayerNormRow {
  const float* x;
  const float* r;
  const uint16_t* x16;
  const uint16_t* r16;
  bool residual() const { return r != nullptr || r16 != nullptr; }
  vw at(int64_t i) const {
    const vw xv = x16 ? load_bf16<vw>(x16 + i) : load_w(x + i);
    if (!residual()) return xv;
    return xv + (r16 ? load_bf16<vw>(r16 + i) : load_w(r + i));
  }
  vf at_half(int64_t i) const {
    const vf xv = x16 ? load_bf16(x16 + i) : load(x + i);
    if (!residual()) return xv;
    return xv + (r16 ? load_bf16(r16 + i) : load(r + i));
  }
  float one(int64_t i) const {
    const float xv = x16 ? bf16_to_f32(x16[i]) : x[i];
    if (!residual()) return xv;
    return xv + (r16 ? bf16_to_f32(r16[i]) : r[i]);
  }
};

// Pass 1 of a row: s stored in st (unless null: s is x's f32 row), as doubles in sd, and its sum
// in double, in the four chains of sum_chains (chain k takes the vf steps i + k W of each 4W).
double layer_norm_sum(const LayerNormRow& in, int64_t d, float* st, double* sd) {
  const int64_t dv = d / W * W;
  vd a[4] = {};
  auto keep = [&](int64_t i, vf s) {
    const vd sv = to_double(s);
    std::memcpy(sd + i, &sv, sizeof sv);
    return sv;
  };
  int64_t i = 0;
  for (; i + 4 * W <= dv; i += 4 * W) {
    const vw s0 = in.at(i), s1 = in.at(i + W2);
    if (st) store_w(st + i, s0), store_w(st + i + W2, s1);
    a[0] += keep(i, low_half(s0));
    a[1] += keep(i + W, high_half(s0));
    a[2] += keep(i + 2 * W, low_half(s1));
    a[3] += keep(i + 3 * W, high_half(s1));
  }
  for (; i < dv; i += W) {
    const vf s = in.at_half(i);
    if (st) store(st + i, s);
    a[0] += keep(i, s);
  }
  double sum = 0;
  for (; i < d; ++i) {
    const float s = in.one(i);
    if (st) st[i] = s;
    sum += s;
  }
  return hsum((a[0] + a[1]) + (a[2] + a[3])) + sum;
}

// Pass 3: y = ((s - m_hi) - m_lo) * rstd * w + b over the row s (w, b may be null), into yr (f32)
// or rounded to bf16 into y16.
void layer_norm_affine(const LayerNormForward& p, const float* sr, float m_hi, float m_lo,
                       float rstd, float* yr, uint16_t* y16) {
  const int64_t d = p.d, dw = d / W2 * W2;
  const vw one = splat_w(1.0f);
  auto affine = [&](vw s, vw w, vw b) { return ((s - m_hi) - m_lo) * rstd * w + b; };
  auto put = [&](int64_t i, vw y) {
    if (y16) {
      store_bf16(y16 + i, y);
    } else {
      store_w(yr + i, y);
    }
  };
  int64_t i = 0;
  if (p.w && p.b) {  // the usual case, without the tests in the loop (GCC keeps them there)
    for (; i < dw; i += W2) put(i, affine(load_w(sr + i), load_w(p.w + i), load_w(p.b + i)));
  } else {
    for (; i < dw; i += W2) {
      put(i, affine(load_w(sr + i), p.w ? load_w(p.w + i) : one, p.b ? load_w(p.b + i) : vw{}));
    }
  }
  if (i == d) return;
  float bs[W2] = {}, bw[W2] = {}, bb[W2] = {};
  const size_t bytes = static_cast<size_t>(d - i) * sizeof(float);
  std::memcpy(bs, sr + i, bytes);
  if (p.w) std::memcpy(bw, p.w + i, bytes);
  if (p.b) std::memcpy(bb, p.b + i, bytes);
  const vw y = affine(load_w(bs), p.w ? load_w(bw) : one, load_w(bb));
  for (int64_t l = 0; l < d - i; ++l) {
    if (y16) {
      y16[i + l] = f32_to_bf16(y[l]);
    } else {
      yr[i + l] = y[l];
    }
  }
}

// Rows [r0, r1) in three passes over each row: s and its sum, the variance around the mean (from
// the doubles in sd), the affine map written as f32 or rounded to bf16 straight away.
void layer_norm_forward_rows(const LayerNormForward& p, int64_t r0, int64_t r1, float* stage,
                             double* sd) {
  const int64_t d = p.d, dv = d / W * W;
  for (int64_t n = r0; n < r1; ++n) {
    const LayerNormRow in{p.x ? p.x + n * d : nullptr, p.r ? p.r + n * d : nullptr,
                          p.x16 ? p.x16 + n * d : nullptr, p.r16 ? p.r16 + n * d : nullptr};
    float* yr = p.y16 ? nullptr : p.y + n * d;
    // s as an f32 row: x itself, else stored (in y when y is f32: the affine pass overwrites it).
    float* st = in.residual() || in.x16 ? (yr ? yr : stage) : nullptr;
    const float* sr = st ? st : in.x;
    const double mean = layer_norm_sum(in, d, st, sd) / static_cast<double>(d);
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
    layer_norm_affine(p, sr, m_hi, m_lo, rstd, yr, p.y16 ? p.y16 + n * d : nullptr);
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
