// The element-wise kernels of attn::nn (see elementwise.h), compiled once per instruction set:
// elementwise_<isa>.cc defines ATTN_EW_ISA (the namespace), ATTN_EW_WIDTH (floats per vector) and,
// on x86, ATTN_EW_TARGET_PRAGMA, and includes this file. As in src/backends/cpu, the target pragma
// comes after every shared header, so that inline functions other files also use are not compiled
// for a wider ISA here.
//
// The activations are evaluated in double lanes and rounded to float once; the approximations were
// fitted for this file (weighted least squares iterated towards minimax on the relative error):
//   erf(z)   = z P(z^2) for |z| < 0.5, P of degree 5 (relative error 1.2e-11);
//   erfc(z)  = exp(-z^2) Q(t) / (1 + 2z), t = (z - 2.5) / (z + 2.5), for 0.5 <= z <= 10.6, Q of
//              degree 10 (relative error 5.5e-10 on erfcx(z) (1 + 2z));
//   exp(-a)  = 2^-n e^r, r in [-ln2/2, ln2/2] (Cody-Waite), e^r by its Taylor series to r^8
//              (relative error 2e-10).
// Those errors are below 0.02 ulp of a float, so the f32 results are within ~0.5 ulp (the one
// rounding). Exact GELU, the FFN's hot activation, has cheaper fits of its own (gelu_tail: ~0.15
// ulp, results within ~0.65 ulp). LayerNorm computes in f32 with its statistics in double.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "attn/dtype.h"
#include "contract/dropout.h"
#include "core/dot_form.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "nn/elementwise.h"

#ifndef ATTN_EW_ISA
#error "define ATTN_EW_ISA before including elementwise-inl.h"
#endif

#if defined(ATTN_EW_TARGET_PRAGMA) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
ATTN_EW_TARGET_PRAGMA
#define ATTN_EW_POP_TARGET
#endif

namespace attn::nn::ew::ATTN_EW_ISA {
namespace {

// Lanes per step: half a register of floats, so that their conversion to double fills one register
// (a wider generic vector would be converted lane by lane).
constexpr int W = ATTN_EW_WIDTH / 2;
typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef double vd __attribute__((vector_size(W * 8)));
typedef float vf_mem __attribute__((vector_size(W * 4), aligned(4), may_alias));

inline vf load(const float* p) {
  return *reinterpret_cast<const vf_mem*>(p);
}
inline void store(float* p, vf v) {
  *reinterpret_cast<vf_mem*>(p) = v;
}

// A whole register of floats (2W), for f32 work without double lanes (LayerNorm's passes): it
// splits into two vf halves where doubles are needed.
constexpr int W2 = 2 * W;
typedef float vw __attribute__((vector_size(W2 * 4)));
typedef float vw_mem __attribute__((vector_size(W2 * 4), aligned(4), may_alias));
inline vw load_w(const float* p) {
  return *reinterpret_cast<const vw_mem*>(p);
}
inline void store_w(float* p, vw v) {
  *reinterpret_cast<vw_mem*>(p) = v;
}
inline vw splat_w(float x) {
  vw r;
  for (int l = 0; l < W2; ++l) r[l] = x;
  return r;
}
template <int... L>
inline vf half_of(vw v, int base, std::integer_sequence<int, L...>) {
  return vf{v[base + L]...};
}
inline vf low_half(vw v) {
  return half_of(v, 0, std::make_integer_sequence<int, W>{});
}
inline vf high_half(vw v) {
  return half_of(v, W, std::make_integer_sequence<int, W>{});
}
inline vf splat(float x) {
  vf r;
  for (int l = 0; l < W; ++l) r[l] = x;
  return r;
}
inline vf vabs(vf x) {
  return (vf)((vi)x & 0x7fffffff);
}
inline vw vabs(vw x) {
  return x < 0.0f ? -x : x;
}
inline vd to_double(vf x) {
  // GCC 12 splits the generic conversion into halves and merges them (on AVX2 two 2-lane
  // conversions, an insert and a trip through the stack in LayerNorm's statistics, a LayerNorm in
  // cache 15% slower on a Zen 1; on AVX-512 ~10% slower double-lane kernels): one instruction.
#if ATTN_EW_WIDTH == 16
  return (vd)_mm512_maskz_cvtps_pd(0xff, (__m256)x);
#elif ATTN_EW_WIDTH == 8
  return (vd)_mm256_cvtps_pd((__m128)x);
#else
  return __builtin_convertvector(x, vd);
#endif
}
inline vf to_float(vd x) {
  return __builtin_convertvector(x, vf);
}
// The activations compute in double lanes and round once at the end: every f32 result is then
// within ~0.5 ulp of the exact value, tails included.
typedef int64_t vl __attribute__((vector_size(W * 8)));

constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// exp(-a) for a >= 0; 0 for a > 700 (and NaN: callers select special values themselves).
inline vd exp_neg(vd a) {
  const vl ok = a <= 700.0;
  a = ok ? a : 0.0;
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const vd nm = a * 1.4426950408889634 + kMagic;
  const vd n = nm - kMagic;  // round(a / ln2), at most 1010
  // r = n ln2 - a in [-ln2/2, ln2/2]; n * ln2_hi (32 significant bits) is exact.
  const vd r = (n * 0.693147180369123816490 - a) + n * 1.90821492927058770002e-10;
  vd p = r * (1.0 / 40320) + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^-n from the integer in nm's low mantissa bits: exponent field 1023 - n.
  const vl k = (vl)nm - 0x4338000000000000LL;
  const vd scale = (vd)((1023 - k) << 52);
  return ok ? p * scale : 0.0;
}

// erf(z) on |z| < 0.5, z times a polynomial in z^2.
inline vd erf_small(vd z) {
  const vd w = z * z;
  vd p = w * -0.00076928953893610661 + 0.0052003108397150593;
  p = p * w - 0.026863120403587699;
  p = p * w + 0.112837738097362;
  p = p * w - 0.37612638519234287;
  p = p * w + 1.128379167082084;
  return z * p;
}

// erfcx(z) = exp(z^2) erfc(z) for z in [0.5, 10.6] (z is clamped to it).
inline vd erfcx_tail(vd z) {
  z = z < 0.5 ? 0.5 : (z > 10.6 ? 10.6 : z);
  // One division for both quotients: t = (z - 2.5) / (z + 2.5) and q / (1 + 2z).
  const vd u = z + 2.5, v = 1.0 + 2.0 * z, r = 1.0 / (u * v);
  const vd t = (z - 2.5) * v * r;
  vd q = t * -5.6621039697952742e-05 + 0.00052256029070881763;
  q = q * t + 0.00046671922285884042;
  q = q * t - 0.0043397949961215317;
  q = q * t + 0.00093941506378102829;
  q = q * t + 0.032753539466010631;
  q = q * t - 0.10296798469988395;
  q = q * t + 0.15763044937714321;
  q = q * t - 0.099024499882358327;
  q = q * t - 0.12235677391346912;
  q = q * t + 1.2648381841029386;
  return q * u * r;
}

inline vd vabs(vd x) {
  return x < 0.0 ? -x : x;
}

// Infinities get the limits, NaN passes through (V: vf or vw).
template <class V>
inline V special(V x, V y, V at_pos_inf, V at_neg_inf) {
  const auto inf = vabs(x) == __builtin_inff();
  y = inf ? (x > 0.0f ? at_pos_inf : at_neg_inf) : y;
  return x != x ? x : y;
}

inline vf erf_vec(vf x) {
  const vd z = to_double(x), az = vabs(z);
  const vd big = 1.0 - exp_neg(z * z) * erfcx_tail(az);
  const vd y = az < 0.5 ? erf_small(z) : (z < 0.0 ? -big : big);
  return special(x, to_float(y), splat(1.0f), splat(-1.0f));
}

// R(a) of gelu_tail (and of gelu_tail_f32): the rational function of degrees 4 / 5 on double lanes
// or float lanes (S, the lanes' scalar type; each coefficient rounds to the same float from its
// double as from its decimal).
template <class S, class V>
inline V gelu_tail_ratio(V a) {
  V num = a * S(0.0041531975954405) + S(0.0408809302936339);
  num = num * a + S(0.18396858442286526);
  num = num * a + S(0.4392827327635116);
  num = num * a + S(0.5000000031494177);
  V den = a * S(0.01041041085660893) + S(0.10247941236328);
  den = den * a + S(0.4714072263605233);
  den = den * a + S(1.2055460596818401);
  den = den * a + S(1.676450472481423);
  den = den * a + S(1.0);
  return num / den;
}

// Exact GELU: Phi(-a) = exp(-a^2 / 2) R(a), a = |x| clamped to 15 (past it x Phi(-a) underflows
// and x - x Phi(-a) rounds to x), in double lanes with approximations fitted for this file:
//   R(a) = erfcx(a / sqrt 2) / 2 a rational function of degrees 4 / 5 (relative error 6.3e-9 on
//          [0, 15]; Q's roots lie left of 0 and all coefficients are positive: no cancellation);
//   exp(-h), h = a^2 / 2 (exact in double) = n ln2 + r, |r| <= ln2 / 2: 2^-n times a degree-6
//          polynomial in r (relative error 1.9e-9).
// One pass for every x (no separate erf branch near 0, no clamp of the tail's argument), one
// division per lane; the fits sum to ~0.15 ulp of a float, so the f32 results stay within ~0.65
// ulp; 1.7x faster than composing erf, erfc and exp (tests/nn/elementwise_test.cc bounds it).
struct GeluTail {
  vd xc;  // x clamped to [-15, 15]
  vd q;   // R(|xc|)
  vd e;   // exp(-xc^2 / 2)
};
inline GeluTail gelu_tail(vd x) {
  const vd xc = x < -15.0 ? -15.0 : (x > 15.0 ? 15.0 : x);
  const vd a = vabs(xc), h = 0.5 * (a * a);
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const vd nm = h * 1.4426950408889634 + kMagic;
  const vd n = nm - kMagic;  // round(h / ln2), at most 163
  const vd r = (h - n * 0.693147180369123816490) - n * 1.90821492927058770002e-10;
  vd p = r * 0.0013836838048574382 - 0.00837482215352342;
  p = p * r + 0.04166822604784553;
  p = p * r - 0.16666420094590212;
  p = p * r + 0.499999920761707;
  p = p * r - 1.0000000363397734;
  p = p * r + 1.0000000005545062;
  const vd scale = (vd)((1023 - ((vl)nm - 0x4338000000000000LL)) << 52);  // 2^-n
  return {xc, gelu_tail_ratio<double>(a), p * scale};
}

// GELU(x) = x Phi(-|x|) below 0, x - x Phi(-|x|) above.
inline vf gelu_forward(vf x) {
  const vd xd = to_double(x);
  const GeluTail t = gelu_tail(xd);
  const vd xm = t.xc * t.q * t.e;
  return special(x, to_float(xd < 0.0 ? xm : xd - xm), x, splat(-0.0f));
}

// GELU'(x) = Phi(x) + x phi(x) = [x >= 0] + exp(-x^2 / 2) (x / sqrt(2 pi) -+ R(|x|)).
inline vf gelu_backward(vf x, vf dy) {
  const vd xd = to_double(x);
  const GeluTail t = gelu_tail(xd);
  const vd g = t.e * (t.xc * kInvSqrt2Pi + (xd < 0.0 ? t.q : -t.q));
  return special(x, to_float(to_double(dy) * (xd < 0.0 ? g : 1.0 + g)), dy, 0.0f * dy);
}

#include "nn/elementwise_float_lanes-inl.h"

// x sigmoid(v): sigmoid(v) = 1 / (1 + e) for v >= 0, e / (1 + e) below, e = exp(-|v|); vp = dv/dx.
// SiLU: v = x; tanh-GELU: v = 2u, x / 2 (1 + tanh u) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715
// x^3).
struct Gate {
  vd x, s, s_neg, vp;  // sigmoid(v), sigmoid(-v)
};
template <bool kTanh>
inline Gate gate(vf xf) {
  constexpr double k1 = 1.5957691216057308;  // 2 sqrt(2 / pi)
  constexpr double k3 = k1 * 0.044715;
  const vd x = to_double(xf);
  vd v = x, vp = x * 0.0 + 1.0;
  if constexpr (kTanh) {
    v = x * (k1 + k3 * (x * x));
    vp = k1 + 3 * k3 * (x * x);
  }
  const vd e = exp_neg(vabs(v));
  const vd inv = 1.0 / (1.0 + e);
  const vl pos = v >= 0.0;
  return {x, pos ? inv : e * inv, pos ? e * inv : inv, vp};
}

template <bool kTanh>
inline vf gate_forward(vf x) {
  const Gate g = gate<kTanh>(x);
  return special(x, to_float(g.x * g.s), x, splat(-0.0f));
}

template <bool kTanh>
inline vf gate_backward(vf x, vf dy) {
  const Gate g = gate<kTanh>(x);
  const vd grad = g.s + g.x * g.vp * g.s * g.s_neg;
  return special(x, to_float(to_double(dy) * grad), dy, 0.0f * dy);
}

inline vf gelu_tanh_forward(vf x) {
  return gate_forward<true>(x);
}
inline vf gelu_tanh_backward(vf x, vf dy) {
  return gate_backward<true>(x, dy);
}
inline vf silu_forward(vf x) {
  return gate_forward<false>(x);
}
inline vf silu_backward(vf x, vf dy) {
  return gate_backward<false>(x, dy);
}

template <class V>  // vf or vw
inline V relu_forward(V x) {
  return (x > 0.0f) | (x != x) ? x : 0.0f;
}
inline vf relu_backward(vf x, vf dy) {
  return x > 0.0f ? dy : 0.0f;
}

// y[i] = f(x[i]); the last n % W elements through a zero-padded vector.
template <class F>
void map1(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(y + i, f(load(x + i)));
  if (i < n) {
    float bx[W] = {};
    std::memcpy(bx, x + i, static_cast<size_t>(n - i) * sizeof(float));
    store(bx, f(load(bx)));
    std::memcpy(y + i, bx, static_cast<size_t>(n - i) * sizeof(float));
  }
}

template <class F>
void map2(const float* x, const float* g, float* d, int64_t n, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(d + i, f(load(x + i), load(g + i)));
  if (i < n) {
    float bx[W] = {}, bg[W] = {};
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    std::memcpy(bx, x + i, bytes);
    std::memcpy(bg, g + i, bytes);
    store(bx, f(load(bx), load(bg)));
    std::memcpy(d + i, bx, bytes);
  }
}

// h[c] += b[c]; y[c] = f(h[c]).
template <class F>
void bias_map(float* h, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vf v = load(h + i) + load(b + i);
    store(h + i, v);
    store(y + i, f(v));
  }
  if (i < n) {
    float bh[W] = {}, bb[W] = {};
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    std::memcpy(bh, h + i, bytes);
    std::memcpy(bb, b + i, bytes);
    const vf v = load(bh) + load(bb);
    std::memcpy(h + i, &v, bytes);
    store(bh, f(v));
    std::memcpy(y + i, bh, bytes);
  }
}

// Calls body(f) with the forward function of a.
template <class Body>
void with_forward(Activation a, Body&& body) {
  switch (a) {
    case Activation::relu:
      return body([](vf x) { return relu_forward(x); });
    case Activation::gelu:
      return body([](vf x) { return gelu_forward(x); });
    case Activation::gelu_tanh:
      return body([](vf x) { return gelu_tanh_forward(x); });
    case Activation::silu:
      return body([](vf x) { return silu_forward(x); });
  }
}

void act_forward(Activation a, const float* x, float* y, int64_t n) {
  with_forward(a, [&](auto f) { map1(x, y, n, f); });
}

void act_backward(Activation a, const float* x, const float* dy, float* dx, int64_t n) {
  switch (a) {
    case Activation::relu:
      return map2(x, dy, dx, n, [](vf v, vf g) { return relu_backward(v, g); });
    case Activation::gelu:
      return map2(x, dy, dx, n, [](vf v, vf g) { return gelu_backward(v, g); });
    case Activation::gelu_tanh:
      return map2(x, dy, dx, n, [](vf v, vf g) { return gelu_tanh_backward(v, g); });
    case Activation::silu:
      return map2(x, dy, dx, n, [](vf v, vf g) { return silu_backward(v, g); });
  }
}

void bias_act_row(Activation a, float* h, const float* b, float* y, int64_t cols) {
  with_forward(a, [&](auto f) { bias_map(h, b, y, cols, f); });
}

void erf_kernel(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](vf v) { return erf_vec(v); });
}

double hsum(vd v) {
  double s = 0;
  for (int l = 0; l < W; ++l) s += v[l];
  return s;
}

// bf16 bit patterns <-> f32 lanes and rows of n: widening is exact (a shift); rounding is to nearest
// even, a NaN stays a quiet NaN (attn::f32_to_bf16's bits). The lane functions take vf or vw.
typedef uint16_t vh __attribute__((vector_size(W * 2)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));
template <class V>
struct Bf16Lanes {
  static constexpr int n = sizeof(V) / 4;
  typedef uint32_t U __attribute__((vector_size(n * 4)));
  typedef uint16_t H __attribute__((vector_size(n * 2)));
};

void widen_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    vh h;
    std::memcpy(&h, src + i, sizeof h);
    store(dst + i, (vf)(__builtin_convertvector(h, vu) << 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

template <class V>
inline typename Bf16Lanes<V>::H to_bf16(V x) {
  using U = typename Bf16Lanes<V>::U;
  const U u = (U)x;
  const U nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U quiet = (u >> 16) | 0x0040u;
  return __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? quiet : nearest,
                                 typename Bf16Lanes<V>::H);
}

// y rounded to bf16 (nearest even, NaN quiet) and widened back: f32 lanes holding bf16 values.
inline vf rounded_to_bf16(vf y) {
  return (vf)(__builtin_convertvector(to_bf16(y), vu) << 16);
}

template <class V = vf>
inline V load_bf16(const uint16_t* p) {
  typename Bf16Lanes<V>::H h;
  std::memcpy(&h, p, sizeof h);
  return (V)(__builtin_convertvector(h, typename Bf16Lanes<V>::U) << 16);
}
template <class V>
inline void store_bf16(uint16_t* p, V v) {
  const auto r = to_bf16(v);
  std::memcpy(p, &r, sizeof r);
}

// body(i, m) over [0, cols) in whole vectors (m == W, a constant the compiler sees), then the last m
// < W elements once; the body handles a partial vector through zero-padded buffers.
template <class Body>
void by_vectors(int64_t cols, Body&& body) {
  int64_t i = 0;
  for (; i + W <= cols; i += W) body(i, std::integral_constant<int64_t, W>{});
  if (i < cols) body(i, cols - i);
}

// with_forward for results rounded to bf16: every activation in float lanes (the functions *_for_bf16
// above), each a generic lambda that takes vf or vw.
template <class Body>
void with_forward_bf16(Activation a, Body&& body) {
  switch (a) {
    case Activation::relu:
      return body([](auto x) { return relu_forward(x); });
    case Activation::gelu:
      return body([](auto x) { return gelu_forward_for_bf16(x); });
    case Activation::gelu_tanh:
      return body([](auto x) { return gate_forward_for_bf16<true>(x); });
    case Activation::silu:
      return body([](auto x) { return gate_forward_for_bf16<false>(x); });
  }
}

// h[c] += b[c]; out[c] = bf16(f(h[c])): autocast's FFN activation (h keeps the pre-activation), and
// the tile Linear's fused activation. Whole registers first (the same bits as vf lanes: the same
// operations lane by lane), the rest below.
void bias_act_bf16_row(Activation a, float* h, const float* b, uint16_t* out, int64_t cols) {
  with_forward_bf16(a, [&](auto f) {
    int64_t i0 = 0;
    for (; i0 + W2 <= cols; i0 += W2) {
      const vw v = load_w(h + i0) + load_w(b + i0);
      store_w(h + i0, v);
      store_bf16(out + i0, f(v));
    }
    float* const hr = h + i0;
    const float* const br = b + i0;
    uint16_t* const outr = out + i0;
    by_vectors(cols - i0, [&](int64_t i, auto m) {
      if constexpr (std::is_same_v<decltype(m), int64_t>) {
        float bh[W] = {};
        uint16_t bo[W];
        for (int64_t l = 0; l < m; ++l) bh[l] = hr[i + l] + br[i + l];
        const vf v = load(bh);
        store_bf16(bo, f(v));
        for (int64_t l = 0; l < m; ++l) hr[i + l] = bh[l], outr[i + l] = bo[l];
      } else {
        const vf v = load(hr + i) + load(br + i);
        store(hr + i, v);
        store_bf16(outr + i, f(v));
      }
    });
  });
}

// y[i] = bf16(f(x[i])) from bf16 x: the bf16 activation modules' forward in one pass, without a
// widened copy of x or an f32 result rounded afterwards; float lanes on whole registers first (as
// bias_act_bf16_row), the rest below.
void act_forward_bf16_row(Activation a, const uint16_t* x, uint16_t* y, int64_t n) {
  with_forward_bf16(a, [&](auto f) {
    int64_t i0 = 0;
    for (; i0 + W2 <= n; i0 += W2) store_bf16(y + i0, f(load_bf16<vw>(x + i0)));
    const uint16_t* const xr = x + i0;
    uint16_t* const yr = y + i0;
    by_vectors(n - i0, [&](int64_t i, auto m) {
      if constexpr (std::is_same_v<decltype(m), int64_t>) {
        uint16_t bx[W] = {}, by[W];
        std::memcpy(bx, xr + i, static_cast<size_t>(m) * sizeof(uint16_t));
        store_bf16(by, f(load_bf16(bx)));
        std::memcpy(yr + i, by, static_cast<size_t>(m) * sizeof(uint16_t));
      } else {
        store_bf16(yr + i, f(load_bf16(xr + i)));
      }
    });
  });
}

// h[c] = bf16(f(h[c] + b[c])) as f32 (the bf16 modules' FFN on the f32 product path).
void bias_act_round_bf16_row(Activation a, float* h, const float* b, int64_t cols) {
  with_forward_bf16(
      a, [&](auto f) { bias_map(h, b, h, cols, [&f](vf v) { return rounded_to_bf16(f(v)); }); });
}

// Calls body(df) with the backward function of a: df(x, dy) = dy f'(x).
template <class Body>
void with_backward(Activation a, Body&& body) {
  switch (a) {
    case Activation::relu:
      return body([](vf v, vf g) { return relu_backward(v, g); });
    case Activation::gelu:
      return body([](vf v, vf g) { return gelu_backward(v, g); });
    case Activation::gelu_tanh:
      return body([](vf v, vf g) { return gelu_tanh_backward(v, g); });
    case Activation::silu:
      return body([](vf v, vf g) { return silu_backward(v, g); });
  }
}

template <class Body>
void with_backward_bf16(Activation a, Body&& body) {
  if (a == Activation::gelu) return body([](vf x, vf g) { return gelu_backward_f32(x, g); });
  with_backward(a, body);
}

// dx[c] = bf16(dy[c] f'(x[c])) from bf16 dy; db[c] += the f32 product (before rounding), when db.
void act_backward_bf16_row(Activation a, const float* x, const uint16_t* dy, uint16_t* dx,
                           float* db, int64_t cols) {
  with_backward_bf16(a, [&](auto df) {
    by_vectors(cols, [&](int64_t i, auto m) {
      if constexpr (std::is_same_v<decltype(m), int64_t>) {
        float bx[W] = {}, bd[W];
        uint16_t bg[W] = {}, bo[W];
        for (int64_t l = 0; l < m; ++l) bx[l] = x[i + l], bg[l] = dy[i + l];
        const vf d = df(load(bx), load_bf16(bg));
        store(bd, d);
        store_bf16(bo, d);
        for (int64_t l = 0; l < m; ++l) {
          dx[i + l] = bo[l];
          if (db) db[i + l] += bd[l];
        }
      } else {
        const vf d = df(load(x + i), load_bf16(dy + i));
        store_bf16(dx + i, d);
        if (db) store(db + i, load(db + i) + d);
      }
    });
  });
}

void add_bf16_row(const uint16_t* src, float* acc, int64_t cols) {
  by_vectors(cols, [&](int64_t i, auto m) {
    if constexpr (std::is_same_v<decltype(m), int64_t>) {
      for (int64_t l = 0; l < m; ++l) acc[i + l] += bf16_to_f32(src[i + l]);
    } else {
      store(acc + i, load(acc + i) + load_bf16(src + i));
    }
  });
}

void round_row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vh h = to_bf16(load(src + i));
    std::memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

// out = bf16(y + b) over one row of n (b may be null): the bias added in f32, one rounding.
void bias_round_row(const float* y, const float* b, uint16_t* out, int64_t n) {
  if (!b) return round_row(y, out, n);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vh h = to_bf16(load(y + i) + load(b + i));
    std::memcpy(out + i, &h, sizeof h);
  }
  for (; i < n; ++i) out[i] = f32_to_bf16(y[i] + b[i]);
}

}  // namespace
}  // namespace attn::nn::ew::ATTN_EW_ISA

// LayerNorm's row kernels (the same instruction set, in the same anonymous namespace).
#include "nn/elementwise_layer_norm-inl.h"

namespace attn::nn::ew::ATTN_EW_ISA {
namespace {
#include "nn/elementwise_dot_linear-inl.h"
#include "nn/elementwise_dropout-inl.h"
}  // namespace
}  // namespace attn::nn::ew::ATTN_EW_ISA

namespace attn::nn::ew::ATTN_EW_ISA {

const Kernels kernels = {act_forward,
                         act_backward,
                         bias_act_row,
                         bias_act_round_bf16_row,
                         erf_kernel,
                         widen_row,
                         round_row,
                         bias_round_row,
                         layer_norm_forward_rows,
                         layer_norm_backward_rows,
                         bias_act_bf16_row,
                         act_backward_bf16_row,
                         act_forward_bf16_row,
                         add_bf16_row,
                         dropout_f32,
                         dropout_bf16,
                         linear_dot_cols};

}  // namespace attn::nn::ew::ATTN_EW_ISA

#ifdef ATTN_EW_POP_TARGET
#pragma GCC pop_options
#undef ATTN_EW_POP_TARGET
#endif
