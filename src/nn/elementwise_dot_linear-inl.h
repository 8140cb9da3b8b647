// The f32 Linear product of few rows in dot-product form (elementwise.h: linear_dot), included by
// elementwise-inl.h inside namespace attn::nn::ew::<isa> (its vector helpers; no headers of its
// own). y [M, N] = x [M, K] w [N, K]^T (+ b): each output is a dot product of a row of x with a row
// of w, read where they are. A library GEMM packs w (the whole weight matrix) into its own layout
// on every call, which costs more than the product itself when M is small (oneDNN 2.6.3 on a Zen
// 4, 2 threads, M 16: 56-153 GFLOP/s against 172-199 here); this form reads each weight once per
// call and needs no packing or cache of it.
//
// The blocks, the K tail and the lane folds are core/dot_form-inl.h's (shared with the cpu
// backend's bf16 product on VDPBF16PS); here are the operands: x in f32, w in f32 or as bf16 bit
// patterns widened in registers, W2 lanes a step, one FMA per output per step.

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

// The operand policy of dot_form-inl.h: f32 rows of x, f32 or bf16 rows of w, W2 lanes a step.
template <class WeightT>
struct DotOperands {
  using X = float;
  using Wt = WeightT;
  using V = vw;
  static constexpr int64_t kStep = W2;
  static vw load_x(const float* p) { return load_weights(p); }
  static vw load_w(const Wt* p) { return load_weights(p); }
  static vw load_x_part(const float* p, int64_t n) { return load_part(p, n); }
  static vw load_w_part(const Wt* p, int64_t n) { return load_part(p, n); }
  static vw madd(vw acc, vw x, vw w) { return acc + x * w; }
};

#include "core/dot_form-inl.h"

// Columns [n0, n1) of p.y, every row.
void linear_dot_cols(const DotLinear& p, int64_t n0, int64_t n1) {
  if (p.w16 != nullptr) {
    return dot_columns<DotOperands<uint16_t>, kDotRows>({p.x, p.w16, p.b, p.y, p.M, p.N, p.K}, n0,
                                                        n1);
  }
  dot_columns<DotOperands<float>, kDotRows>({p.x, p.w, p.b, p.y, p.M, p.N, p.K}, n0, n1);
}
