// Scores of one tile row and the online softmax (included inside namespace attn::cpu::<isa>, after
// simd-inl.h). Forward and backward share the scoring: after S = Q K^T, each row of a tile goes
// through, in the contract's order,
//   scale  s = scale * (q . k);  softcap  s = c * tanh(s / c);  ALiBi  s -= slope[h] * |p(i) - j|;
//   add mask  s += m;
// and then removal (s = -inf by selection, never by arithmetic, so a NaN score of a removed key
// vanishes): the position rule (causal / window / key length) on partial tiles, keep/drop masks,
// block layout cells.

// A strided 4-D view [B, H, L, X] as raw bytes; the last dim may be unit-stride or broadcast
// (stride 0).
struct View4 {
  char* base = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // strides in elements
  int64_t item = 0;
  DType dtype = DType::f32;

  static View4 of(const Tensor& t) {
    View4 v;
    if (!t.defined()) return v;
    v.base = static_cast<char*>(t.data());
    v.s0 = t.stride(0), v.s1 = t.stride(1), v.s2 = t.stride(2);
    v.s3 = t.dim() > 3 ? t.stride(3) : 0;
    v.item = static_cast<int64_t>(t.itemsize());
    v.dtype = t.dtype();
    return v;
  }
  char* row(int64_t b, int64_t h, int64_t i) const {
    return base + (b * s0 + h * s1 + i * s2) * item;
  }
};

// How a tile of rows [i0, i1) x keys [j0, j1) is computed.
struct TileInfo {
  bool skip = false;        // no (i, j) of the tile is allowed
  bool positional = false;  // the position rule must be applied per element
  bool biased = false;      // a dense mask or a partly true block-layout region applies per element
};

// Everything needed to turn the scaled dot products of (b, h) into final scores.
struct RowScorer {
  const contract::ForwardProblem* p = nullptr;
  int64_t b = 0, h = 0, key_length = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  float slope = 0.0f;
  bool alibi = false;
  View4 mask;    // [B, Hq, Lq, Lk], broadcast strides
  View4 layout;  // [B, Hq, Lq / block_q, Lk / block_k]

  RowScorer(const contract::ForwardProblem& prob, int64_t b_, int64_t h_) : p(&prob), b(b_), h(h_) {
    key_length = prob.key_length_of(b);
    scale = static_cast<float>(prob.scale);
    softcap = static_cast<float>(prob.softcap);
    alibi = !prob.alibi.empty();
    if (alibi) slope = static_cast<float>(prob.alibi[h]);
    mask = View4::of(prob.mask);
    layout = View4::of(prob.block_layout);
  }

  TileInfo classify(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    TileInfo t;
    const contract::TileKind kind = contract::classify_tile(p->rule, key_length, i0, i1, j0, j1);
    if (kind == contract::TileKind::empty) {
      t.skip = true;
      return t;
    }
    t.positional = kind == contract::TileKind::partial;
    t.biased = mask.base != nullptr;
    if (layout.base != nullptr) {
      // The layout cells the tile overlaps: none true = skip, all true = no per-element work.
      int64_t n_true = 0, n_cells = 0;
      for (int64_t bi = i0 / p->block_q; bi <= (i1 - 1) / p->block_q; ++bi) {
        const char* row = layout.row(b, h, bi);
        for (int64_t bj = j0 / p->block_k; bj <= (j1 - 1) / p->block_k; ++bj) {
          n_true += row[bj * layout.s3] != 0;
          ++n_cells;
        }
      }
      if (n_true == 0) {
        t.skip = true;
        return t;
      }
      if (n_true != n_cells) t.biased = true;
    }
    return t;
  }

  // bias[0, nk): what the dense mask and the block layout add to row i's scores at keys j0 + [0,
  // nk): 0, an add-mask value, or -inf for a removed key.
  void fill_bias(int64_t i, int64_t j0, int64_t nk, float* bias) const {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    if (mask.base != nullptr) {
      const char* row = mask.row(b, h, i);
      const int64_t sj = mask.s3 * mask.item;
      const char* at = row + j0 * sj;
      switch (p->mask_type) {
        case MaskType::keep:
          for (int64_t j = 0; j < nk; ++j) bias[j] = at[j * sj] != 0 ? 0.0f : ninf;
          break;
        case MaskType::drop:
          for (int64_t j = 0; j < nk; ++j) bias[j] = at[j * sj] != 0 ? ninf : 0.0f;
          break;
        case MaskType::add:
          switch (mask.dtype) {
            case DType::f32:
              for (int64_t j = 0; j < nk; ++j)
                bias[j] = *reinterpret_cast<const float*>(at + j * sj);
              break;
            case DType::f64:
              for (int64_t j = 0; j < nk; ++j) {
                bias[j] = static_cast<float>(*reinterpret_cast<const double*>(at + j * sj));
              }
              break;
            case DType::bf16:
              for (int64_t j = 0; j < nk; ++j)
                bias[j] = bf16_to_f32(*reinterpret_cast<const uint16_t*>(at + j * sj));
              break;
            case DType::f16:
              for (int64_t j = 0; j < nk; ++j)
                bias[j] = f16_to_f32(*reinterpret_cast<const uint16_t*>(at + j * sj));
              break;
            default:
              std::abort();
          }
          break;
      }
    } else {
      std::fill(bias, bias + nk, 0.0f);
    }
    if (layout.base != nullptr) {
      const char* row = layout.row(b, h, i / p->block_q);
      for (int64_t j = 0; j < nk; ++j) {
        if (row[((j0 + j) / p->block_k) * layout.s3] == 0) bias[j] = ninf;
      }
    }
  }

  // Turns row i's dot products s[0, nk) (keys j0 + [0, nk)) into final scores, up to a factor: the
  // scores are (returned factor) * s[j]. The padding lanes up to round_up(nk, W) become scores of
  // -inf. A row that nothing modifies keeps its raw dot products and returns the scale, which the
  // softmax folds into its exp argument (one rounding and one pass over the row fewer); a negative
  // scale is folded too (the max score is then the scale times the least product, and the padding
  // is +inf so that its score is -inf); a zero scale is applied here. Otherwise the result is 1.
  // tanh_out (backward with softcap) receives tanh(s / c) per key.
  float finish_row(const TileInfo& t, int64_t i, int64_t j0, int64_t nk, float* s, float* tanh_out,
                   float* bias) const {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    const int64_t nkp = round_up(nk, W);
    if (scale != 0.0f && !(softcap > 0.0f || alibi || t.biased || t.positional)) {
      for (int64_t j = nk; j < nkp; ++j) s[j] = scale > 0.0f ? ninf : -ninf;
      return scale;
    }
    const vf sc = splat(scale);
    for (int64_t j = 0; j < nkp; j += W) store(s + j, load(s + j) * sc);
    if (softcap > 0.0f) {
      const float inv = 1.0f / softcap;
      for (int64_t j = 0; j < nkp; j += W) {
        const vf th = vtanh(load(s + j) * inv);
        if (tanh_out != nullptr) store(tanh_out + j, th);
        store(s + j, th * softcap);
      }
    }
    if (alibi) {
      const vf pos = splat(static_cast<float>(p->rule.pos(i) - j0));
      const vf lanes = iota_f();
      for (int64_t j = 0; j < nkp; j += W) {
        const vf dist = vabs(pos - (lanes + static_cast<float>(j)));
        store(s + j, load(s + j) - slope * dist);
      }
    }
    if (t.biased) {
      fill_bias(i, j0, nk, bias);
      for (int64_t j = nk; j < nkp; ++j) bias[j] = 0.0f;
      for (int64_t j = 0; j < nkp; j += W) {
        const vf m = load(bias + j);
        store(s + j, m == ninf ? splat(ninf) : load(s + j) + m);
      }
    }
    if (t.positional) {
      int64_t lo, hi;
      p->rule.key_range(i, key_length, &lo, &hi);
      const vf flo = splat(static_cast<float>(std::clamp<int64_t>(lo - j0, -1, nkp)));
      const vf fhi = splat(static_cast<float>(std::clamp<int64_t>(hi - j0, -1, nkp)));
      const vf lanes = iota_f();
      for (int64_t j = 0; j < nkp; j += W) {
        const vf jj = lanes + static_cast<float>(j);
        store(s + j, ((jj >= flo) & (jj < fhi)) ? load(s + j) : splat(ninf));
      }
    }
    for (int64_t j = nk; j < nkp; ++j) s[j] = ninf;
    return 1.0f;
  }
};

// max that keeps a NaN (std::max(a, b) drops a NaN b).
inline float nan_max(float a, float b) {
  return std::isnan(a) || a >= b ? a : b;
}

// Split-KV partials of one task: chunk c holds O [rows x Dvp], then m [rows], then l [rows] (the
// unnormalised output, max and sum of each row over the chunk's keys) at part + c * (rows * (Dvp +
// 2)). Merges row r over the chunks in chunk order into o [Dvp] and *l and returns the row's max:
// m = max_c m_c, l = sum_c l_c e^(m_c - m), O = sum_c O_c e^(m_c - m). A row that no chunk saw an
// allowed key of gets m = -inf, l = 0, O = 0; a NaN max (a NaN row) gets l = NaN and O = NaN.
inline float merge_partials_row(const float* part, int64_t n_chunks, int64_t rows, int64_t Dvp,
                                int64_t r, float* o, float* l) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const int64_t per = rows * (Dvp + 2);
  float mx = ninf;
  for (int64_t c = 0; c < n_chunks; ++c) mx = nan_max(mx, part[c * per + rows * Dvp + r]);
  if (std::isnan(mx)) {
    *l = mx;
    std::fill(o, o + Dvp, mx);
    return mx;
  }
  *l = 0.0f;
  std::fill(o, o + Dvp, 0.0f);
  if (mx == ninf) return mx;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const float* src = part + c * per;
    const float mc = src[rows * Dvp + r];
    if (mc == ninf) continue;  // no allowed key in this chunk
    const float f = std::exp(mc - mx);
    *l += src[rows * (Dvp + 1) + r] * f;
    const vf fv = splat(f);
    for (int64_t d = 0; d < Dvp; d += W) store(o + d, load(o + d) + fv * load(src + r * Dvp + d));
  }
  return mx;
}

// Where online_softmax_row writes P: in place over the scores (f32), or rounded to bf16 into a
// row of halves (the A operand of the pair products, which then needs no pass of its own).
struct PInPlace {
  static constexpr bool kRoundsToBf16 = false;
  float* s;
  void put(int64_t j, vf y) const { store(s + j, y); }
  void zero(int64_t n) const { std::fill(s, s + n, 0.0f); }
};
#if defined(ATTN_CPU_BF16_DOT)
struct PAsBf16 {
  static constexpr bool kRoundsToBf16 = true;  // P in 8 significant bits: vexp2_for_bf16 will do
  uint16_t* p;
  void zero(int64_t n) const { std::fill(p, p + n, uint16_t{0}); }
};

// p[j] = bf16(2^(s[j] * factor - shift)) for j < n (a multiple of W); returns the sum of the f32
// values as exp_shifted_row does (lane l: the entries j = l mod W, in order of j). On AVX-512 with
// BF16, two vectors per VCVTNE2PS2BF16 (the same rounding as VCVTNEPS2BF16, half the conversions:
// with VREDUCEPS in vexp2_for_bf16, ~11.5 operations per vector instead of ~14; a bf16 forward on
// an AMX Xeon 1-9% faster, the same bits).
inline vf exp2_row_as_bf16(const float* s, int64_t n, vf factor, vf shift, uint16_t* p) {
  vf sum = vf{};
  int64_t j = 0;
#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_SOFT_BF16)
  for (; j + 2 * W <= n; j += 2 * W) {
    const vf y0 = vexp2_for_bf16(load(s + j) * factor - shift);
    const vf y1 = vexp2_for_bf16(load(s + j + W) * factor - shift);
    // The second source fills the low half.
    const __m512bh both =
        _mm512_cvtne2ps_pbh(__builtin_bit_cast(__m512, y1), __builtin_bit_cast(__m512, y0));
    _mm512_storeu_si512(p + j, __builtin_bit_cast(__m512i, both));
    sum += y0;
    sum += y1;
  }
#endif
  for (; j < n; j += W) {
    const vf y = vexp2_for_bf16(load(s + j) * factor - shift);
    *reinterpret_cast<vh_mem*>(p + j) = to_bf16(y);
    sum += y;
  }
  return sum;
}
#endif

// The product s that finish_row leaves for a removed key under its returned factor: -inf, or +inf
// when a negative scale was folded into the factor (the score factor * s is -inf either way).
// Selecting on s rather than on factor * s keeps that product a single use, which the compiler
// fuses with the subtraction of the max as everywhere else (a separate product rounded P
// differently in two builds of the same source: the CLI's and the Python extension's weights).
inline vf removed_product(vf factor) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  return factor > 0.0f ? splat(-inf) : splat(inf);
}

// pick over s[0, nkp) (vmax or vmin), starting from `init` in every lane, in four independent
// chains: one chain waited on each pick's latency (a row of 256 keys: 16 dependent picks, ~64 cycles
// before its exp pass could start; the max pass was 15% of a bf16 forward on AMX). Max and min are
// exact, so the extreme is the same in any order (a NaN may be dropped either way: the exp pass
// makes its row NaN).
template <class Pick>
inline vf row_extreme(const float* s, int64_t nkp, float init, Pick pick) {
  vf a0 = splat(init), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 4 * W <= nkp; j += 4 * W) {
    a0 = pick(a0, load(s + j));
    a1 = pick(a1, load(s + j + W));
    a2 = pick(a2, load(s + j + 2 * W));
    a3 = pick(a3, load(s + j + 3 * W));
  }
  for (; j < nkp; j += W) a0 = pick(a0, load(s + j));
  return pick(pick(a0, a1), pick(a2, a3));
}

// The max of the scores factor * s[0, nkp) (factor != 0, from finish_row): rounding is monotonic,
// so it is the scaled max (factor > 0) or the scaled min (factor < 0) of the products. -inf when
// every key is removed; a NaN score may be dropped (online_softmax_row looks for it then).
inline float row_max_score(const float* s, int64_t nkp, float factor) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const float extreme = factor > 0.0f ? hmax(row_extreme(s, nkp, ninf, vmax))
                                      : hmin(row_extreme(s, nkp, -ninf, vmin));
  return extreme * factor;
}

// One tile row of the online softmax over the scores factor * s[0, nkp), whose max_score is
// row_max_score's. m, l: the row's running max and sum (start at -inf, 0). On return out holds
// P = exp(factor * s - m_new) over [0, nkp) (l sums it in f32, before any rounding) and the result
// is alpha = exp(m_old - m_new), the factor by which the row's output accumulator must be scaled
// before this tile's P V is added.
template <class Out>
inline float online_softmax_row(float* s, int64_t nkp, float factor, float max_score, float* m,
                                float* l, Out out) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const float m_new = nan_max(*m, max_score);
  if (m_new == ninf && std::any_of(s, s + nkp, [](float x) { return std::isnan(x); })) {
    // vmax / hmax may drop NaN: a NaN score (NaN in q or an allowed k) makes the row NaN, as IEEE
    // says (docs/semantics.md); it is not a removed key.
    *m = *l = std::numeric_limits<float>::quiet_NaN();
    out.zero(nkp);
    return *m;
  }
  if (m_new == ninf) {
    // Every key so far is removed: skip exp entirely, so -inf - -inf never happens; P = 0, l stays
    // 0.
    out.zero(nkp);
    return 1.0f;
  }
  // exp(0) is 1 exactly: most tiles after the first few leave a row's max where it was.
  const float alpha = *m == ninf ? 0.0f : *m == m_new ? 1.0f : std::exp(*m - m_new);
  vf sum;
  if constexpr (Out::kRoundsToBf16) {
    // 2^(s factor log2 e - m log2 e) with both products rounded to f32: against e^(s factor - m),
    // a tile's P is scaled by at most 1 + |m| 2^-24, which alpha (exact) does not see, and its
    // exponents by 1 + 2^-24: for |m| < 1000 under 6e-5, a thirtieth of P's bf16 rounding.
    constexpr float log2e = 1.44269504088896341f;
    sum = exp2_row_as_bf16(s, nkp, splat(factor * log2e), splat(m_new * log2e), out.p);
  } else {
    sum = exp_shifted_row(s, nkp, splat(factor), splat(m_new),
                          [&out](int64_t j, vf y) { out.put(j, y); });
  }
  *l = *l * alpha + hsum(sum);
  *m = m_new;
  return alpha;
}

// The vector draws on AVX-512 and AVX2 targets (the 16-lane emulation target, on AVX2 registers,
// keeps the scalar draws).
#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_AMX_EMULATED)
#define ATTN_PHILOX_X16 1
#include "contract/philox_lanes-inl.h"
#elif ATTN_CPU_WIDTH == 8
#define ATTN_PHILOX_X8 1
#include "contract/philox_lanes-inl.h"
#endif

// Zeroes the dropped weights of row i in p[0, nk) (keys j0 + [0, nk), j0 a multiple of 4); kept
// weights are left as they are (the 1 / (1 - p) scale is applied once, at the end).
inline void drop_row(const contract::DropoutRule& rule, int64_t b, int64_t h, int64_t i, int64_t j0,
                     int64_t nk, float* p) {
  const uint32_t threshold = rule.threshold();
#if defined(ATTN_PHILOX_X16) || defined(ATTN_PHILOX_X8)
  // 4 x kCounters keys per step; element for element the draws of the loop below.
  using P = PhiloxLanes;
  const P gen(rule.seed);
  const P::V thr = PhiloxVec::set1(threshold);
  for (int64_t j = 0; j < nk; j += P::kDraws) {
    P::V e[4];
    gen.draws(static_cast<uint32_t>((j0 + j) >> 2), static_cast<uint32_t>(i),
              static_cast<uint32_t>(h), static_cast<uint32_t>(b + rule.batch_base), e);
    for (int k = 0; k < 4 && j + P::kCounters * k < nk; ++k) {
      const int64_t at = j + P::kCounters * k;
      PhiloxVec::zero_dropped(p + at, e[k], thr, nk - at);
    }
  }
#else
  uint32_t r[4];
  for (int64_t j = 0; j < nk; j += 4) {
    rule.draws4(b, h, i, (j0 + j) >> 2, r);
    for (int64_t l = 0; l < 4 && j + l < nk; ++l) {
      if (r[l] < threshold) p[j + l] = 0.0f;
    }
  }
#endif
}
