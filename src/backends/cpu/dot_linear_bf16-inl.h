// attn's bf16 Linear product of few rows on VDPBF16PS (dot_linear_bf16.h), included inside
// namespace attn::cpu::<isa> by kernels-inl.h, on the targets with the instruction
// (ATTN_CPU_BF16_DOT: avx512bf16, amx, and amx_emulated's software VDPBF16PS for the tests).
// y [M, N] f32 = x [M, K] w [N, K]^T, bf16 bit patterns read where they are: each output is one
// chain of VDPBF16PS over K in 16 lanes of pairs (lane l takes elements 2l and 2l + 1 of every 32),
// the last K % 32 from zero-padded vectors, then core/lane_fold-inl.h's folds of the 16 lanes. The
// same blocks as nn's f32 dot kernel (nn/elementwise_dot_linear-inl.h): 4 rows x 4 columns, the
// rows that do not fill one in 1 x 16 blocks; every output the same chain in either.
#if defined(ATTN_CPU_BF16_DOT)

#include "core/lane_fold-inl.h"

namespace dot_linear_bf16_detail {

inline vu load_pair_words(const uint16_t* p) {
  vu v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// The first n (< 2W) bf16 of a row as pair words, the rest 0.
inline vu load_pair_words_part(const uint16_t* p, int64_t n) {
  uint16_t part[2 * W] = {};
  std::memcpy(part, p, static_cast<size_t>(n) * 2);
  return load_pair_words(part);
}

// The W outputs of a block of R rows x W / R columns: lane r * (W / R) + c is x row xr[r] . w row
// wr[c] over K.
template <int R>
inline vf block(const uint16_t* const* xr, const uint16_t* const* wr, int64_t K) {
  constexpr int C = W / R;
  vf acc[W] = {};
  const auto step = [&](auto load) {
    vu wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load(wr[c]);
    for (int r = 0; r < R; ++r) {
      const vu xv = load(xr[r]);
      for (int c = 0; c < C; ++c) acc[r * C + c] = dot_pairs(acc[r * C + c], xv, wv[c]);
    }
  };
  int64_t k = 0;
  for (; k + 2 * W <= K; k += 2 * W)
    step([&](const uint16_t* row) { return load_pair_words(row + k); });
  if (k < K) step([&](const uint16_t* row) { return load_pair_words_part(row + k, K - k); });
  return fold_lanes(acc);
}

// Rows [m0, m1) x columns [n0, n1) of p.y in blocks of R rows x W / R columns (column blocks
// outermost: their weight rows stay in L1); past the last row or column a block reads it again and
// drops those outputs.
template <int R>
void rows(const DotLinearBf16& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  constexpr int C = W / R;
  for (int64_t n = n0; n < n1; n += C) {
    const uint16_t* wr[C];
    for (int c = 0; c < C; ++c) wr[c] = p.w + std::min(n + c, n1 - 1) * p.K;
    const int cols = static_cast<int>(std::min<int64_t>(C, n1 - n));
    for (int64_t m = m0; m < m1; m += R) {
      const uint16_t* xr[R];
      for (int r = 0; r < R; ++r) xr[r] = p.x + std::min(m + r, m1 - 1) * p.K;
      const vf sum = block<R>(xr, wr, p.K);
      const int used = static_cast<int>(std::min<int64_t>(R, m1 - m));
      for (int r = 0; r < used; ++r)
        for (int c = 0; c < cols; ++c) p.y[(m + r) * p.N + n + c] = sum[r * C + c];
    }
  }
}

}  // namespace dot_linear_bf16_detail

void dot_linear_bf16_cols(const DotLinearBf16& p, int64_t n0, int64_t n1) {
  using namespace dot_linear_bf16_detail;
  const int64_t whole = p.M / 4 * 4;
  rows<4>(p, 0, whole, n0, n1);
  if (whole < p.M) rows<1>(p, whole, p.M, n0, n1);
}

#endif
