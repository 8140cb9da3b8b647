// The f32 Linear product of few rows in dot-product form (elementwise.h: linear_dot), included by
// elementwise-inl.h inside namespace attn::nn::ew::<isa> (its vector helpers; no headers of its
// own). y [M, N] = x [M, K] w [N, K]^T (+ b): each output is a dot product of a row of x with a row
// of w, read where they are. A library GEMM packs w (the whole weight matrix) into its own layout
// on every call, which costs more than the product itself when M is small (oneDNN 2.6.3 on a Zen
// 4, 2 threads, M 16: 56-153 GFLOP/s against 172-199 here); this form reads each weight once per
// call and needs no packing or cache of it.
//
// A block of W2 outputs (rows x columns) keeps one whole-register accumulator per output (both
// operands' loads, rows + columns per step, feed W2 FMAs); accumulator lane l sums the terms
// k = l (mod W2), the last K % W2 terms from zero-padded vectors. A tree of pairwise folds then
// sums every accumulator's lanes at once (core/lane_fold-inl.h: W2 - 1 shuffle-and-add steps for
// W2 outputs). Each output is that one fixed chain whatever the rows, the columns or the thread
// that computes it.

// Outputs per block: W2, as kDotRows x (W2 / kDotRows): 4 x 4 on AVX-512, 2 x 4 on AVX2 (8
// accumulators and 4 w vectors leave registers for x), 1 x 4 on the portable target. The rows
// that do not fill such a block run in blocks of 1 x W2 (each w vector then feeds one FMA: more
// loads, no FMA spent on a padded row).
constexpr int kDotRows = W2 / 4;

#include "core/lane_fold-inl.h"

// W2 weights: f32, or bf16 bit patterns widened exactly (a shift) in registers.
inline vw load_weights(const float* w) {
  return load_w(w);
}
inline vw load_weights(const uint16_t* w) {
#if ATTN_EW_WIDTH == 16
  // One VPMOVZXWD (GCC lowers the generic conversion below to two halves and inserts; the
  // zero-masked form: the plain one trips GCC 12's maybe-uninitialized on its undefined source).
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return (vw)((typename Bf16Lanes<vw>::U)_mm512_maskz_cvtepu16_epi32(0xffff, h) << 16);
#elif ATTN_EW_WIDTH == 8 && defined(__x86_64__)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return (vw)((typename Bf16Lanes<vw>::U)_mm256_cvtepu16_epi32(h) << 16);
#else
  typename Bf16Lanes<vw>::H h;
  std::memcpy(&h, w, sizeof h);
  return (vw)(__builtin_convertvector(h, typename Bf16Lanes<vw>::U) << 16);
#endif
}
// The first n (< W2) values of a row as a vector, the other lanes 0.
template <class T>
inline vw load_part(const T* p, int64_t n) {
  T part[W2] = {};
  std::memcpy(part, p, static_cast<size_t>(n) * sizeof(T));
  if constexpr (std::is_same_v<T, float>) {
    return load_w(part);
  } else {
    return load_weights(part);
  }
}

// The W2 outputs of a block of R rows x W2 / R columns: lane r * (W2 / R) + c is x row xr[r] . w
// row wr[c] over K. `ahead` (when not null): weight rows prefetched at each step's offset. Every
// output is the same chain whatever R (the folds sum each accumulator's lanes in one order), so a
// row gives the same bits in any block.
template <int R, class Wt>
inline vw dot_block(const float* const* xr, const Wt* const* wr, int64_t K,
                    const Wt* const* ahead = nullptr) {
  constexpr int C = W2 / R;
  vw acc[W2] = {};
  const auto step = [&](auto load_x, auto load_w_row) {
    vw wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_w_row(wr[c]);
    for (int r = 0; r < R; ++r) {
      const vw xv = load_x(xr[r]);
      for (int c = 0; c < C; ++c) acc[r * C + c] += xv * wv[c];
    }
  };
  int64_t k = 0;
  for (; k + W2 <= K; k += W2) {
    if (ahead != nullptr)
      for (int c = 0; c < C; ++c) __builtin_prefetch(ahead[c] + k);
    step([&](const float* x) { return load_w(x + k); },
         [&](const Wt* w) { return load_weights(w + k); });
  }
  if (k < K) {  // the last K % W2 terms, zero-padded: the same FMAs into the same lanes
    const int64_t n = K - k;
    step([&](const float* x) { return load_part(x + k, n); },
         [&](const Wt* w) { return load_part(w + k, n); });
  }
  return fold_lanes(acc);
}

// Rows [m0, m1) x columns [n0, n1) of p.y in blocks of R rows x W2 / R columns. Column blocks
// outermost: a block's weight rows stay in L1 while the row blocks of x pass them, and the first
// row block prefetches the next column block's weight rows (a model's weights past the L3 come
// from memory: MiniLM f32 at 1 x 16 tokens 13% faster, 9 of 10 alternations, Zen 4). Past the
// last row or column a block reads the last one again; those outputs are not stored.
template <int R, class Wt>
void dot_rows(const DotLinear& p, const Wt* w, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  constexpr int C = W2 / R;
  for (int64_t n = n0; n < n1; n += C) {
    const Wt* wr[C];
    const Wt* next[C];
    for (int c = 0; c < C; ++c) {
      wr[c] = w + std::min(n + c, n1 - 1) * p.K;
      next[c] = w + std::min(n + C + c, n1 - 1) * p.K;
    }
    const int cols = static_cast<int>(std::min<int64_t>(C, n1 - n));
    for (int64_t m = m0; m < m1; m += R) {
      const float* xr[R];
      for (int r = 0; r < R; ++r) xr[r] = p.x + std::min(m + r, m1 - 1) * p.K;
      const vw sum = dot_block<R>(xr, wr, p.K, m == m0 ? next : nullptr);
      const int rows = static_cast<int>(std::min<int64_t>(R, m1 - m));
      for (int r = 0; r < rows; ++r) {
        float* y = p.y + (m + r) * p.N + n;
        for (int c = 0; c < cols; ++c) y[c] = p.b ? sum[r * C + c] + p.b[n + c] : sum[r * C + c];
      }
    }
  }
}

template <class Wt>
void dot_cols(const DotLinear& p, const Wt* w, int64_t n0, int64_t n1) {
  const int64_t whole = p.M / kDotRows * kDotRows;
  dot_rows<kDotRows>(p, w, 0, whole, n0, n1);
  if constexpr (kDotRows > 1) {
    if (whole < p.M) dot_rows<1>(p, w, whole, p.M, n0, n1);
  }
}

// Columns [n0, n1) of p.y, every row.
void linear_dot_cols(const DotLinear& p, int64_t n0, int64_t n1) {
  if (p.w16 != nullptr) return dot_cols(p, p.w16, n0, n1);
  dot_cols(p, p.w, n0, n1);
}
