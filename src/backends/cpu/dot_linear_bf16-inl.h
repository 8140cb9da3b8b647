// attn's bf16 Linear product of few rows on VDPBF16PS (dot_linear_bf16.h), included inside
// namespace attn::cpu::<isa> by kernels-inl.h, on the targets with the instruction
// (ATTN_CPU_BF16_DOT: avx512bf16, amx, and amx_emulated's software VDPBF16PS for the tests).
// y [M, N] f32 = x [M, K] w [N, K]^T, bf16 bit patterns read where they are: each output is one
// chain of VDPBF16PS over K in 16 lanes of pairs (lane l takes elements 2l and 2l + 1 of every 32),
// the last K % 32 from zero-padded vectors, then core/lane_fold-inl.h's folds of the 16 lanes. The
// blocks are nn's f32 dot kernel's (core/dot_form-inl.h): 4 rows x 4 columns, the rows that do
// not fill one in 1 x 16 blocks, every output the same chain in either; the first row block
// prefetches the next column block's weight rows.
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

// The operand policy of dot_form-inl.h: bf16 rows of x and w, 2W elements (W pairs) a step, one
// VDPBF16PS per output per step.
struct PairOperands {
  using X = uint16_t;
  using Wt = uint16_t;
  using V = vf;
  static constexpr int64_t kStep = 2 * W;
  static vu load_x(const uint16_t* p) { return load_pair_words(p); }
  static vu load_w(const uint16_t* p) { return load_pair_words(p); }
  static vu load_x_part(const uint16_t* p, int64_t n) { return load_pair_words_part(p, n); }
  static vu load_w_part(const uint16_t* p, int64_t n) { return load_pair_words_part(p, n); }
  static vf madd(vf acc, vu x, vu w) { return dot_pairs(acc, x, w); }
};

#include "core/dot_form-inl.h"

}  // namespace dot_linear_bf16_detail

void dot_linear_bf16_cols(const DotLinearBf16& p, int64_t n0, int64_t n1) {
  namespace detail = dot_linear_bf16_detail;
  detail::dot_columns<detail::PairOperands, 4>({p.x, p.w, nullptr, p.y, p.M, p.N, p.K}, n0, n1);
}

#endif
