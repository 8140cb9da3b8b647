// The dropout rule's Philox4x32-10 draws (contract/dropout.h) for consecutive counters in vector
// lanes, bit for bit Random123's: ~3 instructions per draw on AVX-512 against ~25 for the scalar
// generator (10 rounds of two 32 x 32 -> 64-bit products per four draws). One round loop,
// PhiloxLanes, over the lane operations of the target's width, PhiloxVec: 16 counters (64 draws) on
// AVX-512F, 8 (32 draws) on AVX2.
//
// Included inside a per-ISA namespace, after its target pragma, by src/backends/cpu/
// online_softmax-inl.h and src/nn/elementwise_dropout-inl.h, which define ATTN_PHILOX_X16 (an
// AVX-512 target) or ATTN_PHILOX_X8 (an AVX2 one) first. No include guard: each instruction set's
// namespace gets its own copy.

#if defined(ATTN_PHILOX_X16)
struct PhiloxVec {
  using V = __m512i;
  static constexpr int kLanes = 16;
  static V set1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static V iota() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V xor3(V a, V b, V c) { return _mm512_xor_si512(_mm512_xor_si512(a, b), c); }
  // hi:lo = m * x per lane (64-bit products of the even lanes, then of the odd ones). The masked
  // forms name every source (the unmasked intrinsics' undefined() trips GCC 12's
  // maybe-uninitialized).
  static void mulhilo(V m, V x, V* hi, V* lo) {
    const __mmask8 all = 0xff;
    const V even = _mm512_mask_mul_epu32(x, all, x, m);
    const V odd = _mm512_mask_mul_epu32(x, all, _mm512_mask_srli_epi64(x, all, x, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_mask_slli_epi64(odd, all, odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_mask_srli_epi64(even, all, even, 32), odd);
  }
  // w_l lane t = word l of counter t -> e[k] lane m = word l = m % 4 of counter 4k + m / 4: per
  // output two two-source permutes (words 0/1, words 2/3 of those counters) and a blend.
  static void in_element_order(V w0, V w1, V w2, V w3, V e[4]) {
    // lane m: counter m / 4 of the first source (l even) or of the second (l odd, + 16)
    const V base = _mm512_setr_epi32(0, 16, 0, 16, 1, 17, 1, 17, 2, 18, 2, 18, 3, 19, 3, 19);
    for (int k = 0; k < 4; ++k) {
      const V idx = _mm512_add_epi32(base, _mm512_set1_epi32(4 * k));
      const V words01 = _mm512_permutex2var_epi32(w0, idx, w1);
      const V words23 = _mm512_permutex2var_epi32(w2, idx, w3);
      e[k] = _mm512_mask_blend_epi32(0xCCCC, words01, words23);  // lanes with l = 2, 3
    }
  }
  // p[0, min(n, 16)) zeroed where the draw is below threshold (unsigned), the rest left as it is.
  static void zero_dropped(float* p, V draw, V threshold, int64_t n) {
    const __mmask16 in = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
    const __mmask16 keep = _mm512_cmpge_epu32_mask(draw, threshold);
    _mm512_mask_storeu_ps(p, in, _mm512_maskz_mov_ps(keep, _mm512_maskz_loadu_ps(in, p)));
  }
  // s[0, 16) = keep_scale where the draw is >= threshold, else 0.
  static void scales(float* s, V draw, V threshold, float keep_scale) {
    const __mmask16 keep = _mm512_cmpge_epu32_mask(draw, threshold);
    _mm512_storeu_ps(s, _mm512_maskz_mov_ps(keep, _mm512_set1_ps(keep_scale)));
  }
};
#elif defined(ATTN_PHILOX_X8)
struct PhiloxVec {
  using V = __m256i;
  static constexpr int kLanes = 8;
  static V set1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static V iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V xor3(V a, V b, V c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
  static void mulhilo(V m, V x, V* hi, V* lo) {
    const V even = _mm256_mul_epu32(x, m);
    const V odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }
  // w_l lane t = word l of counter t -> e[k] lane m = word m % 4 of counter 2k + m / 4: a 4 x 4
  // transpose inside each 128-bit half, then the halves paired.
  static void in_element_order(V w0, V w1, V w2, V w3, V e[4]) {
    const V a0 = _mm256_unpacklo_epi32(w0, w1), a1 = _mm256_unpackhi_epi32(w0, w1);
    const V a2 = _mm256_unpacklo_epi32(w2, w3), a3 = _mm256_unpackhi_epi32(w2, w3);
    // u_m, half h: the four words of counter 4h + m
    const V u0 = _mm256_unpacklo_epi64(a0, a2), u1 = _mm256_unpackhi_epi64(a0, a2);
    const V u2 = _mm256_unpacklo_epi64(a1, a3), u3 = _mm256_unpackhi_epi64(a1, a3);
    e[0] = _mm256_permute2x128_si256(u0, u1, 0x20);  // counters 0, 1
    e[1] = _mm256_permute2x128_si256(u2, u3, 0x20);  // 2, 3
    e[2] = _mm256_permute2x128_si256(u0, u1, 0x31);  // 4, 5
    e[3] = _mm256_permute2x128_si256(u2, u3, 0x31);  // 6, 7
  }
  // All-ones lanes where the draw is >= threshold (unsigned), zero elsewhere.
  static V kept(V draw, V threshold) {
    return _mm256_cmpeq_epi32(_mm256_max_epu32(draw, threshold), draw);
  }
  static void zero_dropped(float* p, V draw, V threshold, int64_t n) {
    const V keep = kept(draw, threshold);
    if (n >= 8) {
      _mm256_storeu_ps(p, _mm256_and_ps(_mm256_loadu_ps(p), _mm256_castsi256_ps(keep)));
      return;
    }
    alignas(32) uint32_t k[8];
    _mm256_store_si256(reinterpret_cast<V*>(k), keep);
    for (int64_t l = 0; l < n; ++l) {
      if (!k[l]) p[l] = 0.0f;
    }
  }
  static void scales(float* s, V draw, V threshold, float keep_scale) {
    const __m256 keep = _mm256_castsi256_ps(kept(draw, threshold));
    _mm256_storeu_ps(s, _mm256_and_ps(_mm256_set1_ps(keep_scale), keep));
  }
};
#endif

// Philox4x32-10 under one key for the counters (c0 + t, c1, c2, c3), t < kCounters.
class PhiloxLanes {
 public:
  using V = PhiloxVec::V;
  static constexpr int kCounters = PhiloxVec::kLanes;
  static constexpr int kDraws = 4 * kCounters;

  explicit PhiloxLanes(uint64_t seed) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < kRounds; ++r) {  // round r uses the key bumped r times
      k0_[r] = PhiloxVec::set1(k0);
      k1_[r] = PhiloxVec::set1(k1);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  // The kDraws draws of the counters in element order (element 4t + l = word l of counter t, as
  // DropoutRule::draws4 numbers them): e[k] holds elements k kCounters .. (k + 1) kCounters - 1.
  void draws(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, V e[4]) const {
    using P = PhiloxVec;
    V x0 = P::add(P::set1(c0), P::iota()), x1 = P::set1(c1), x2 = P::set1(c2), x3 = P::set1(c3);
    const V m0 = P::set1(0xD2511F53u), m1 = P::set1(0xCD9E8D57u);
    for (int r = 0; r < kRounds; ++r) {
      V hi0, lo0, hi1, lo1;
      P::mulhilo(m0, x0, &hi0, &lo0);
      P::mulhilo(m1, x2, &hi1, &lo1);
      x0 = P::xor3(hi1, x1, k0_[r]);
      x1 = lo1;
      x2 = P::xor3(hi0, x3, k1_[r]);
      x3 = lo0;
    }
    P::in_element_order(x0, x1, x2, x3, e);
  }

 private:
  static constexpr int kRounds = 10;
  V k0_[kRounds], k1_[kRounds];
};
