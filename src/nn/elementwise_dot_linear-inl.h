// The f32 Linear product of few rows in dot-product form (elementwise.h: linear_dot), included by
// elementwise-inl.h inside namespace attn::nn::ew::<isa> (its vector helpers; no headers of its own). y [M, N] = x [M, K] w [N, K]^T (+ b):
// each output is a dot product of a row of x with a row of w, read where they are. A library GEMM
// packs w (the whole weight matrix) into its own layout on every call, which costs more than the
// product itself when M is small (oneDNN 2.6.3 on a Zen 4, 2 threads, M 16: 22-93 GFLOP/s against
// 180-215 here); this form reads each weight once per call and needs no packing or cache of it.
//
// A block of kDotRows x kDotCols outputs keeps one whole-register accumulator per output
// (kDotRows * kDotCols == W2, so both operands' loads, kDotRows + kDotCols per step, feed W2
// FMAs); accumulator lane l sums the terms k = l (mod W2). A tree of pairwise folds then sums
// every accumulator's lanes at once (W2 - 1 shuffle-and-add steps for W2 outputs), and the last
// K % W2 terms are added one by one. Each output is that one fixed chain whatever the rows, the
// columns or the thread that computes it.

// Outputs per block: W2 = 16 on AVX-512 (4 x 4), 8 on AVX2 (2 x 4: 8 accumulators and 4 w vectors
// leave registers for x), 4 on the portable target (1 x 4).
constexpr int kDotCols = 4;
constexpr int kDotRows = W2 / kDotCols;

// Lane p of one fold of a and b, which hold W2 / S items of S lanes each: item t of the result is
// item t of a (t < W2 / S) or item t - W2 / S of b, its S / 2 lanes the sums of the item's two
// halves (upper: the index of the second half's lane).
template <int S>
constexpr int fold_lane(int p, bool upper) {
  const int half = S / 2, per = W2 / S, t = p / half;
  return (t < per ? 0 : W2) + (t % per) * S + p % half + (upper ? half : 0);
}
template <int S, int... P>
inline vw fold(vw a, vw b, std::integer_sequence<int, P...>) {
  return __builtin_shufflevector(a, b, fold_lane<S>(P, false)...) +
         __builtin_shufflevector(a, b, fold_lane<S>(P, true)...);
}
// v [0, N) hold items of S lanes, folded pairwise level by level: given W2 whole accumulators
// (S = N = W2), v[0] ends with lane j the sum of accumulator j's lanes.
template <int S, int N>
inline void fold_all(vw* v) {
  for (int i = 0; i < N / 2; ++i)
    v[i] = fold<S>(v[2 * i], v[2 * i + 1], std::make_integer_sequence<int, W2>{});
  if constexpr (S > 2) fold_all<S / 2, N / 2>(v);
}

// W2 weights: f32, or bf16 bit patterns widened exactly (a shift) in registers.
inline vw load_weights(const float* w) {
  return load_w(w);
}
inline vw load_weights(const uint16_t* w) {
  typename Bf16Lanes<vw>::H h;
  std::memcpy(&h, w, sizeof h);
  return (vw)(__builtin_convertvector(h, typename Bf16Lanes<vw>::U) << 16);
}
inline float weight(float w) {
  return w;
}
inline float weight(uint16_t w) {
  return bf16_to_f32(w);
}

// The W2 outputs of one block: lane r * kDotCols + c is x row xr[r] . w row wr[c] over K.
template <class Wt>
inline vw dot_block(const float* const* xr, const Wt* const* wr, int64_t K) {
  vw acc[W2] = {};
  int64_t k = 0;
  for (; k + W2 <= K; k += W2) {
    vw wv[kDotCols];
    for (int c = 0; c < kDotCols; ++c) wv[c] = load_weights(wr[c] + k);
    for (int r = 0; r < kDotRows; ++r) {
      const vw xv = load_w(xr[r] + k);
      for (int c = 0; c < kDotCols; ++c) acc[r * kDotCols + c] += xv * wv[c];
    }
  }
  fold_all<W2, W2>(acc);
  vw sum = acc[0];
  for (; k < K; ++k)
    for (int r = 0; r < kDotRows; ++r)
      for (int c = 0; c < kDotCols; ++c) sum[r * kDotCols + c] += xr[r][k] * weight(wr[c][k]);
  return sum;
}

// Columns [n0, n1) of p.y, every row. Column blocks outermost: a block's kDotCols weight rows stay
// in L1 while every row block of x passes them. Past the last row or column a block reads the
// last one again; those outputs are not stored.
template <class Wt>
void dot_cols(const DotLinear& p, const Wt* w, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += kDotCols) {
    const Wt* wr[kDotCols];
    for (int c = 0; c < kDotCols; ++c) wr[c] = w + std::min(n + c, p.N - 1) * p.K;
    const int cols = static_cast<int>(std::min<int64_t>(kDotCols, n1 - n));
    for (int64_t m = 0; m < p.M; m += kDotRows) {
      const float* xr[kDotRows];
      for (int r = 0; r < kDotRows; ++r) xr[r] = p.x + std::min(m + r, p.M - 1) * p.K;
      const vw sum = dot_block(xr, wr, p.K);
      const int rows = static_cast<int>(std::min<int64_t>(kDotRows, p.M - m));
      for (int r = 0; r < rows; ++r) {
        float* y = p.y + (m + r) * p.N + n;
        for (int c = 0; c < cols; ++c)
          y[c] = p.b ? sum[r * kDotCols + c] + p.b[n + c] : sum[r * kDotCols + c];
      }
    }
  }
}

void linear_dot_cols(const DotLinear& p, int64_t n0, int64_t n1) {
  if (p.w16 != nullptr) return dot_cols(p, p.w16, n0, n1);
  dot_cols(p, p.w, n0, n1);
}
