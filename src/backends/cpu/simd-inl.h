// SIMD vocabulary of the cpu backend, written once with GCC vector extensions and compiled once per
// instruction set (isa_*.cc set the target flags): W floats per vector = 16 (AVX-512), 8 (AVX2+FMA)
// or 4 (portable SSE2 / any 128-bit target). Included inside namespace attn::cpu::<isa>; no include
// guard on purpose, each ISA translation unit includes it exactly once.
//
// Contents: vector types and unaligned loads/stores, dtype conversion of rows (f32 / bf16 / f16 <->
// f32), and the vectorised exp, expm1-based tanh used by the softmax and the softcap.

inline constexpr int W = ATTN_CPU_WIDTH;

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));
typedef uint16_t vh __attribute__((vector_size(W * 2)));
// Unaligned, aliasing views for loads and stores through float / uint16_t pointers.
typedef float vf_mem __attribute__((vector_size(W * 4), aligned(4), may_alias));
typedef uint16_t vh_mem __attribute__((vector_size(W * 2), aligned(2), may_alias));

// 64-byte aligned allocator for scratch and partial buffers. Defined per ISA namespace on purpose:
// the containers that use it are then distinct types per target, so the linker cannot fold an
// AVX-512 instantiation into the portable path.
template <class T>
struct AlignedAlloc {
  using value_type = T;
  AlignedAlloc() = default;
  template <class U>
  AlignedAlloc(const AlignedAlloc<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* ptr = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (ptr == nullptr) throw std::bad_alloc();
    return static_cast<T*>(ptr);
  }
  void deallocate(T* ptr, size_t) { std::free(ptr); }
  template <class U>
  bool operator==(const AlignedAlloc<U>&) const {
    return true;
  }
};

inline vf load(const float* p) {
  return *reinterpret_cast<const vf_mem*>(p);
}
inline void store(float* p, vf x) {
  *reinterpret_cast<vf_mem*>(p) = x;
}
// Broadcast through a lane-0 shuffle (vbroadcastss); `vf{} + x` would add 0.0 first (-0 + 0 is not
// -0).
#if defined(__clang__)
// clang has no __builtin_shuffle; __builtin_shufflevector takes the lane indices as constants.
template <int... L>
inline vf splat_lane0(vf v, std::integer_sequence<int, L...>) {
  return __builtin_shufflevector(v, v, (L * 0)...);
}
#endif
inline vf splat(float x) {
#if defined(__clang__)
  return splat_lane0(vf{x}, std::make_integer_sequence<int, W>{});
#else
  return __builtin_shuffle(vf{x}, vi{});
#endif
}
inline vf iota_f() {
  vf r;
  for (int l = 0; l < W; ++l) r[l] = static_cast<float>(l);
  return r;
}
inline vf vmax(vf a, vf b) {
  return a > b ? a : b;
}
inline vf vmin(vf a, vf b) {
  return a < b ? a : b;
}
inline vf vabs(vf a) {
  return a < 0.0f ? -a : a;
}
// Horizontal max and sum by halving (log2 W steps of a lane swap and one vector op) instead of a
// serial chain of W scalar ops: the chain's latency (~50 cycles for the sum at W = 16) sat on every
// row of every tile of the online softmax. Lane l meets lane l ^ S at the step of distance S, so
// the order of the sum is fixed per ISA (results stay bitwise reproducible).
template <int S, int... L>
inline vf swap_lanes(vf x, std::integer_sequence<int, L...>) {
  return __builtin_shufflevector(x, x, (L ^ S)...);
}
inline float hmax(vf x) {
  constexpr auto lanes = std::make_integer_sequence<int, W>{};
  if constexpr (W >= 16) x = vmax(x, swap_lanes<8>(x, lanes));
  if constexpr (W >= 8) x = vmax(x, swap_lanes<4>(x, lanes));
  x = vmax(x, swap_lanes<2>(x, lanes));
  x = vmax(x, swap_lanes<1>(x, lanes));
  return x[0];
}
inline float hmin(vf x) {
  return -hmax(-x);
}
inline float hsum(vf x) {
  constexpr auto lanes = std::make_integer_sequence<int, W>{};
  if constexpr (W >= 16) x += swap_lanes<8>(x, lanes);
  if constexpr (W >= 8) x += swap_lanes<4>(x, lanes);
  x += swap_lanes<2>(x, lanes);
  x += swap_lanes<1>(x, lanes);
  return x[0];
}
constexpr int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

// p * 2^n for integer-valued n, p in [0.7, 1.42] (the exps' polynomials): one VSCALEFPS on AVX-512,
// else n added to the exponent bits, the same value wherever the result is a normal float (the
// callers flush the lanes where it would not be). A NaN p stays NaN (n << 23 is 0 for a NaN n,
// which converts to INT_MIN). Unsigned words: for flushed lanes (n down to -2^22) the sum wraps,
// which signed ints may not (UBSan).
inline vf times_pow2(vf p, vf n) {
#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_SOFT_BF16)
  // The masked form names every source (the unmasked intrinsic's undefined() trips GCC 12's
  // maybe-uninitialized).
  return __builtin_bit_cast(
      vf, _mm512_mask_scalef_ps(__builtin_bit_cast(__m512, p), static_cast<__mmask16>(0xffff),
                                __builtin_bit_cast(__m512, p), __builtin_bit_cast(__m512, n)));
#else
  const vu n_bits = __builtin_bit_cast(vu, __builtin_convertvector(n, vi));
  return __builtin_bit_cast(vf, __builtin_bit_cast(vu, p) + (n_bits << 23));
#endif
}

// exp(x) for x <= 88 (the softmax only feeds x = s - max <= 0): x = n ln2 + r with n = round(x
// log2 e) (the 1.5 * 2^23 trick, one FMA and one subtraction), |r| <= ln2 / 2 by Cody-Waite
// reduction, e^r by a degree-6 polynomial fitted here for relative error over [-ln2/2, ln2/2]
// (2e-9 in exact arithmetic), then times 2^n: one VSCALEFPS on AVX-512, else n added to the
// exponent bits. Below -87.33 (where 2^n would be subnormal) and at -inf the result is 0; NaN
// stays NaN. Measured accuracy: tests/cpu/vexp_test.cc.
//
// The softmax loops are bound by this function's chain of dependent operations and by its FMA-pipe
// operations, so: the polynomial is in Estrin's form (r^2 beside the first two pairs of terms: 4
// dependent FMAs instead of 6), 1 + r is added last (the terms of degree >= 2 are small, so the sum
// keeps f32's rounding near 1), the clamp is one MINPS, and 2^n is an integer add of n << 23 to the
// bits of e^r rather than a multiplication (e^r is in [0.7, 1.42] and n >= -126 where x >= -87.33,
// so the sum is a normal float). Zen 3, a softmax row of 256: 2.87 -> 2.19 ns per vector of 8.
inline vf vexp(vf x) {
  const vf lo = splat(-87.33f);
  const auto flushed = x < lo;  // false for NaN, which stays NaN through r and p
#if ATTN_CPU_WIDTH == 8
  // n <= 127 for the exponent bits (n below the range is flushed anyway). MINPS returns its second
  // operand when either is NaN, so with x second a NaN stays NaN.
  const vf xc =
      __builtin_bit_cast(vf, _mm256_min_ps(_mm256_set1_ps(88.0f), __builtin_bit_cast(__m256, x)));
#elif ATTN_CPU_WIDTH == 4 || defined(ATTN_CPU_SOFT_BF16)
  const vf xc = x > 88.0f ? splat(88.0f) : x;
#else
  const vf xc = x;  // VSCALEFPS takes any n
#endif
  const vf n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // |x log2 e| < 2^22
  // ln 2 = 0.693145751953125 (15 significant bits, so n * hi is exact) + 1.4286068203094172e-06.
  vf r = xc - n * 0.693145751953125f;
  r = r - n * 1.4286068203094172e-06f;
  // e^r = 1 + r + r^2 (c2 + c3 r + r^2 (c4 + c5 r + c6 r^2)).
  const vf r2 = r * r;
  const vf c23 = r * 0.16666431725025177f + 0.4999999403953552f;
  const vf c45 = r * 0.00837415549904108f + 0.04166800156235695f;
  const vf c46 = r2 * 0.0013843646738678217f + c45;
  const vf c26 = r2 * c46 + c23;
  const vf p = (r2 * c26 + r) + 1.0f;
  return flushed ? vf{} : times_pow2(p, n);
}

// 2^x where the result is rounded to bf16 next (8 significant bits: the softmax's P for the bf16
// pair products), x <= ~0: n = round(x) (the 1.5 * 2^23 trick), 2^(x - n) by 1 + r (c1 + ... + c4
// r^3), fitted here for relative error over [-1/2, 1/2] with the constant held at 1 (2.8e-6, far
// below bf16's 2^-9 = 2e-3, which P's rounding adds next; 2^0 is exactly 1), times 2^n. The row sums
// l are of these f32 values, so lse = m + log l carries their error: degree 3 (1.0e-4) put lse past
// its 1e-5 bound. 0 below -126 (no subnormal terms in the row sums) and at -inf; NaN stays NaN. With
// the factor log2 e folded into the caller's FMA this is 6 operations fewer per vector than vexp (no
// Cody-Waite reduction, 4 polynomial steps for 6, no clamp), the exp pass being the larger part of a
// bf16 forward on AMX tiles. (Degree 5 until 2026-12-06: docs/PERFORMANCE.md, "exp polynomials".)
//
// n and r: on AVX-512, r = VREDUCEPS(x) (x less x rounded to an integer, to nearest even: exact)
// and n = x - r (exact), one operation fewer than the 1.5 * 2^23 trick and the same n and r (both
// round to nearest even; |x| < 2^22 wherever the lane is kept), so the same bits on every 16-lane
// target (tests/cpu/vexp_test.cc).
inline vf vexp2_for_bf16(vf x) {
  const auto flushed = x < -126.0f;  // false for NaN, which stays NaN through r and p
#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_SOFT_BF16)
  const vf r =
      __builtin_bit_cast(vf, _mm512_reduce_ps(__builtin_bit_cast(__m512, x),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const vf n = x - r;
#else
  const vf n = (x + 12582912.0f) - 12582912.0f;
  const vf r = x - n;
#endif
  vf p = r * 0.0095826992765069f + 0.05590594559907913f;
  p = p * r + 0.24024099111557007f;
  p = p * r + 0.6931242942810059f;
  p = p * r + 1.0f;
  return flushed ? vf{} : times_pow2(p, n);  // n in [-126, 0] where kept: a normal float
}

// put(j, exp(s[j] * factor - shift)) for j < n (a multiple of W), one vector at a time; returns
// the sum of the results as a vector (lane l: the entries j = l mod W, added in order of j). The bf16
// forward's P has its own loop, exp2_row_as_bf16 (online_softmax-inl.h).
template <class Put>
inline vf exp_shifted_row(const float* s, int64_t n, vf factor, vf shift, Put put) {
  vf sum = vf{};
  for (int64_t j = 0; j < n; j += W) {
    const vf y = vexp(load(s + j) * factor - shift);
    put(j, y);
    sum += y;
  }
  return sum;
}

// W words of bf16 pairs (2W elements; the even one in the low half of each word). Alignment 1:
// pair words of bf16 rows start at any even byte.
typedef uint32_t vu_mem __attribute__((vector_size(W * 4), aligned(1), may_alias));
inline vu load_words(const uint32_t* p) {
  return *reinterpret_cast<const vu_mem*>(p);
}

#if defined(ATTN_CPU_BF16_DOT)
// The two bf16 instructions of the pair products (bf16_dot-inl.h, the decode) as functions of the
// vector types: VDPBF16PS (dot_pairs: acc + a.hi * b.hi + a.lo * b.lo per lane) and VCVTNEPS2BF16
// (to_bf16: f32 to bf16, round to nearest even). The amx-emulated target (ATTN_CPU_SOFT_BF16)
// computes both in software from their documented definitions, so that it runs on any AVX2 CPU:
// the odd pair's exact product added first, then the even one's, each sum rounded to f32; bf16 and
// f32 denormal inputs and f32 denormal results as zero; NaN converted to a quiet NaN.

#if defined(ATTN_CPU_SOFT_BF16)
inline vf flush_denormals(vf x) {
  const vu bits = __builtin_bit_cast(vu, x);
  return __builtin_bit_cast(vf, (bits & 0x7f800000u) == 0 ? bits & 0x80000000u : bits);
}
inline vf dot_pairs(vf acc, vu a, vu b) {
  const vu hi = vu{} + 0xffff0000u;
  const vf a_hi = flush_denormals(__builtin_bit_cast(vf, a & hi));
  const vf b_hi = flush_denormals(__builtin_bit_cast(vf, b & hi));
  const vf a_lo = flush_denormals(__builtin_bit_cast(vf, a << 16));
  const vf b_lo = flush_denormals(__builtin_bit_cast(vf, b << 16));
  acc = flush_denormals(flush_denormals(acc) + a_hi * b_hi);  // the product is exact in f32
  return flush_denormals(acc + a_lo * b_lo);
}
inline vh to_bf16(vf x) {
  const vu bits = __builtin_bit_cast(vu, flush_denormals(x));
  const vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const vu nan = (bits >> 16) | 0x40u;
  return __builtin_convertvector((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded, vh);
}
#else
inline vf dot_pairs(vf acc, vu a, vu b) {
  return __builtin_bit_cast(
      vf, _mm512_dpbf16_ps(__builtin_bit_cast(__m512, acc), __builtin_bit_cast(__m512bh, a),
                           __builtin_bit_cast(__m512bh, b)));
}
inline vh to_bf16(vf x) {
  return __builtin_bit_cast(vh, _mm512_cvtneps_pbh(__builtin_bit_cast(__m512, x)));
}
#endif
#endif

// expm1(y) for y <= 0 with full relative accuracy near 0 (Taylor to degree 9 for |y| < ln2/2, where
// exp(y) - 1 would cancel), exp(y) - 1 elsewhere.
inline vf vexpm1_neg(vf y) {
  vf p = splat(1.0f / 362880.0f);
  p = p * y + 1.0f / 40320.0f;
  p = p * y + 1.0f / 5040.0f;
  p = p * y + 1.0f / 720.0f;
  p = p * y + 1.0f / 120.0f;
  p = p * y + 1.0f / 24.0f;
  p = p * y + 1.0f / 6.0f;
  p = p * y + 0.5f;
  p = p * y + 1.0f;
  const vf small = p * y;
  const vf big = vexp(y) - 1.0f;
  return y > -0.34657359f ? small : big;
}

// tanh(x) with a relative error of a couple of ulp everywhere, which the softcap needs (c * tanh(s
// / c) must keep the absolute error of s near eps * |s|, not eps * c): the odd Taylor polynomial to
// x^13 for |x| < 0.35 (truncation < 2e-8 relative; the common case, since softcaps are large), else
// sign(x) * -e / (2 + e) with e = expm1(-2|x|).
inline vf vtanh(vf x) {
  const vf x2 = x * x;
  vf p = splat(21844.0f / 6081075.0f);
  p = p * x2 - 1382.0f / 155925.0f;
  p = p * x2 + 62.0f / 2835.0f;
  p = p * x2 - 17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 - 1.0f / 3.0f;
  const vf small = x + x * (p * x2);
  const vf e = vexpm1_neg(-2.0f * vabs(x));
  const vf t = -e / (2.0f + e);
  const vf big = x < 0.0f ? -t : t;
  return vabs(x) < 0.35f ? small : big;
}

// Rows of any input dtype to f32 and back. `n` elements; the f32 side is contiguous.
inline void load_row(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      int64_t j = 0;
      for (; j + W <= n; j += W) {
        const vh h = *reinterpret_cast<const vh_mem*>(s + j);
        const vu u = __builtin_convertvector(h, vu) << 16;
        store(dst + j, __builtin_bit_cast(vf, u));
      }
      for (; j < n; ++j) dst[j] = bf16_to_f32(s[j]);
      return;
    }
    case DType::f16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t j = 0; j < n; ++j) dst[j] = f16_to_f32(s[j]);
      return;
    }
    default:
      std::abort();  // validated upstream: q, k, v, out are f32 / bf16 / f16 here
  }
}

// bf16 bits of x rounded to nearest even, a NaN made quiet: attn::f32_to_bf16 (attn/dtype.h) on W
// lanes, denormals kept. Not VCVTNEPS2BF16, which reads and writes denormals as zero.
inline vh round_to_bf16(vf x) {
  const vu u = __builtin_bit_cast(vu, x);
  const vu nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : nearest, vh);
}

inline void store_row(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16: {
      // Whole vectors (round_to_bf16, as tile_linear rounds), then the tail one by one.
      uint16_t* d = static_cast<uint16_t*>(dst);
      int64_t j = 0;
      for (; j + W <= n; j += W) *reinterpret_cast<vh_mem*>(d + j) = round_to_bf16(load(src + j));
      for (; j < n; ++j) d[j] = f32_to_bf16(src[j]);
      return;
    }
    case DType::f16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t j = 0; j < n; ++j) d[j] = f32_to_f16(src[j]);
      return;
    }
    default:
      std::abort();
  }
}

// True when every value of the n floats is finite (an inf or NaN in a tile switches its products to
// the path that skips zero weights instead of multiplying by them).
inline bool all_finite(const float* x, int64_t n) {
  const vi exp_mask = vi{} + 0x7f800000;
  vi any = vi{};
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const vf v = load(x + j);
    any |= (__builtin_bit_cast(vi, v) & exp_mask) == exp_mask;
  }
  for (int l = 0; l < W; ++l) {
    if (any[l]) return false;
  }
  for (; j < n; ++j) {
    if (!std::isfinite(x[j])) return false;
  }
  return true;
}
