// The activations for results rounded to bf16 next, in float lanes (elementwise.h: the bf16
// modules, autocast's FFN, the fused product epilogues), included by elementwise-inl.h after its
// double-lane activations, in the same instruction set's anonymous namespace (no headers of its
// own): GELU's derivative on gelu_tail's fits, and forwards with fits sized for bf16 (GELU, and
// SiLU / tanh-GELU through one float-lane sigmoid). Each takes vf or whole registers (vw), with the
// same bits lane by lane.

// GELU's derivative for results rounded to bf16 (autocast's FFN backward): gelu_tail's fits
// evaluated in float lanes (no conversions to double, a float division), exp(-h) by a degree-6
// Taylor polynomial on the Cody-Waite reduced argument. Relative error a few times 1e-7 (h = a^2 / 2
// is rounded in float: ~3e-6 at a = 13), far below bf16's 3.9e-3, so the rounded results are within
// a bf16 rounding (tests/nn/elementwise_test.cc bounds them against double). Below -13 the
// derivative is 0, as double's underflows would give. The forward for bf16 results has cheaper
// fits of its own (gelu_forward_for_bf16, below).
template <class V>
struct GeluTailF {
  V xc, q, e;  // x clamped to [-13, 13], R(|xc|), exp(-xc^2 / 2)
};
template <class V>
inline GeluTailF<V> gelu_tail_f32(V x) {
  using I = decltype(x < x);  // int32 lanes
  const V xc = x < -13.0f ? -13.0f : (x > 13.0f ? 13.0f : x);
  const V a = vabs(xc), h = 0.5f * (a * a);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23 (bits 0x4b400000): adding it rounds
  const V nm = h * 1.44269504f + kMagic;
  const V n = nm - kMagic;                                        // round(h / ln2), at most 122
  const V r = (h - n * 0.693145751953125f) - n * 1.42860677e-6f;  // ln2 split hi + lo
  V p = r * (1.0f / 720) - (1.0f / 120);
  p = p * r + (1.0f / 24);
  p = p * r - (1.0f / 6);
  p = p * r + 0.5f;
  p = p * r - 1.0f;
  p = p * r + 1.0f;
  const V scale = (V)((127 - ((I)nm - 0x4b400000)) << 23);  // 2^-n
  return {xc, gelu_tail_ratio<float>(a), p * scale};
}

// 1 / d (d >= 1 here) to about float precision: AVX-512's reciprocal estimate (14 bits, the same
// bits on every CPU that has it) and one Newton step; a division on the other targets (AVX2's
// estimate differs between CPU makers).
template <class V>
inline V reciprocal(V d) {
#if ATTN_EW_WIDTH == 16
  V r;
  if constexpr (sizeof(V) == 64) {
    r = (V)_mm512_maskz_rcp14_ps(0xffff, (__m512)d);  // maskz: GCC 12 warns of the unmasked one
  } else {
    r = (V)_mm256_maskz_rcp14_ps(0xff, (__m256)d);
  }
  return r * (2.0f - d * r);
#else
  return 1.0f / d;
#endif
}

// Exact GELU for results rounded to bf16 next (8 significant bits), forward only: x Phi(-|x|) below
// 0, x - x Phi(-|x|) above, Phi(-a) = exp(-a^2 / 2) R(a) as in gelu_tail_f32 but with fits sized for
// bf16 (fitted for this file, iterated towards minimax on the relative error over [0, 13]):
//   R(a) by a rational function of degrees 2 / 3 (relative error 2.3e-5; Q's roots lie left of 0),
//        its division by reciprocal();
//   exp(-a^2 / 2) = 2^y, y = -a^2 log2(e) / 2 = n + f, |f| <= 1/2, 2^f of degree 3 (7.6e-5).
// Together ~1e-4 of the result, 0.026 of a bf16 ulp: over every bf16 input in [-13.5, 13.5] and 3M
// f32 ones, the rounded results are within 0.523 bf16 ulp of GELU (numpy's float32 model of these
// operations against double). Half the operations of gelu_tail_f32's fits (no Cody-Waite
// reduction, degrees 3 and 2 / 3 for 6 and 4 / 5, no division on AVX-512). Below -13, where GELU is
// smaller than 1e-38, the result is -0; +inf gives +inf (through the clamped xc), NaN stays NaN.
template <class V>
inline V gelu_forward_for_bf16(V x) {
  using I = decltype(x < x);  // int32 lanes
  const V xc = x < -13.0f ? -13.0f : (x > 13.0f ? 13.0f : x);
  const V a = vabs(xc);
  const V y = (a * a) * -0.72134752f;    // -a^2 log2(e) / 2, in [-122, 0]
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23 (bits 0x4b400000): adding it rounds
  const V nm = y + kMagic;
  const V f = y - (nm - kMagic);
  V p = f * 0.055169880390167236f + 0.242606982588768f;
  p = p * f + 0.693260908126831f;
  p = p * f + 0.99992835521698f;
  const V e = p * (V)((127 + ((I)nm - 0x4b400000)) << 23);  // times 2^n, n in [-122, 0]
  const V num = (a * 0.061808891040838594f + 0.27656774649853605f) * a + 0.5000112680683554f;
  const V den =
      ((a * 0.15473819857396437f + 0.6986214669336512f) * a + 1.3517217856232522f) * a + 1.0f;
  const V xm = xc * (num * reciprocal(den) * e);
  return x < -13.0f ? -0.0f * e : (x < 0.0f ? xm : x - xm);
}

// x sigmoid(v) for results rounded to bf16 next (SiLU: v = x; tanh-GELU: v = x (k1 + k3 x^2), as
// gate()), in float lanes: e = exp(-|v|) = 2^y, y = -|v| log2(e) = n + f, 2^f by
// gelu_forward_for_bf16's polynomial (7.6e-5), one reciprocal of 1 + e; sigmoid(v) = 1 / (1 + e) for
// v >= 0, e / (1 + e) below, where 2^n is applied as 2^(n + 24), then 2^-24, so that a result below
// the normal floats (v < -87.3) rounds once into the denormals, as the f32 kernels' doubles do. |v|
// is clamped to 104 (n >= -150); below v = -104 the result is -0 (smaller than bf16's least denormal
// for SiLU, smaller still for tanh-GELU). About 1e-4 of the result; +inf gives +inf, -inf -0, NaN NaN.
template <bool kTanh, class V>
inline V gate_forward_for_bf16(V x) {
  using I = decltype(x < x);  // int32 lanes
  V v = x;
  if constexpr (kTanh) {
    constexpr double k1 = 1.5957691216057308;  // 2 sqrt(2 / pi), as gate()
    v = x * (static_cast<float>(k1) + static_cast<float>(k1 * 0.044715) * (x * x));
  }
  const V av = vabs(v);
  const V y = (av < 104.0f ? av : 104.0f) * -1.44269504f;  // in [-150.04, 0]; NaN: -150.04
  constexpr float kMagic = 12582912.0f;                    // 1.5 * 2^23 (bits 0x4b400000)
  const V nm = y + kMagic;
  const V f = y - (nm - kMagic);
  V p = f * 0.055169880390167236f + 0.242606982588768f;
  p = p * f + 0.693260908126831f;
  p = p * f + 0.99992835521698f;
  const V p24 = p * (V)((151 + ((I)nm - 0x4b400000)) << 23);  // 2^(y + 24), a normal float
  const V r = reciprocal(1.0f + p24 * 0x1p-24f);              // 1 / (1 + e)
  const V g = v >= 0.0f ? x * r : (x * (p24 * r)) * 0x1p-24f;
  return v < -104.0f ? -0.0f * r : g;
}
inline vf gelu_backward_f32(vf x, vf dy) {
  const GeluTailF<vf> t = gelu_tail_f32(x);
  const vf g = t.e * (t.xc * static_cast<float>(kInvSqrt2Pi) + (x < 0.0f ? t.q : -t.q));
  const vf d = x < -13.0f ? 0.0f * dy : dy * (x < 0.0f ? g : 1.0f + g);
  return special(x, d, dy, 0.0f * dy);
}
