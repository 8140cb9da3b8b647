// The dropout rule's Philox4x32-10 draws (contract/dropout.h) for 16 consecutive counters at once
// on AVX-512F, bit for bit Random123's: one draw per element costs ~3 instructions here against ~25
// for the scalar generator (10 rounds of two 32 x 32 -> 64-bit products per four draws).
//
// Included inside a per-ISA namespace, after its target pragma, by targets with AVX-512F (a vector
// width of 16 floats): src/backends/cpu/online_softmax-inl.h and src/nn/elementwise_dropout-inl.h.
// No include guard: each instruction set's namespace gets its own copy.

// Philox4x32-10 under one key for the 16 counters (c0 + t, c1, c2, c3), t = 0..15.
class PhiloxX16 {
 public:
  explicit PhiloxX16(uint64_t seed) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < kRounds; ++r) {  // round r uses the key bumped r times
      k0_[r] = _mm512_set1_epi32(static_cast<int>(k0));
      k1_[r] = _mm512_set1_epi32(static_cast<int>(k1));
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  // The 64 draws of the counters in element order (element 4t + l = word l of counter t, as
  // DropoutRule::draws4 numbers them): e[k] holds elements 16k .. 16k + 15.
  void draws(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, __m512i e[4]) const {
    const __m512i t = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i x0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0)), t);
    __m512i x1 = _mm512_set1_epi32(static_cast<int>(c1));
    __m512i x2 = _mm512_set1_epi32(static_cast<int>(c2));
    __m512i x3 = _mm512_set1_epi32(static_cast<int>(c3));
    const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
    for (int r = 0; r < kRounds; ++r) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo(m0, x0, &hi0, &lo0);
      mulhilo(m1, x2, &hi1, &lo1);
      x0 = _mm512_xor_si512(_mm512_xor_si512(hi1, x1), k0_[r]);
      x1 = lo1;
      x2 = _mm512_xor_si512(_mm512_xor_si512(hi0, x3), k1_[r]);
      x3 = lo0;
    }
    in_element_order(x0, x1, x2, x3, e);
  }

 private:
  static constexpr int kRounds = 10;

  // hi:lo = m * x per 32-bit lane (64-bit products of the even lanes, then of the odd ones). The
  // masked forms name every source (the unmasked intrinsics' undefined() trips GCC 12's
  // maybe-uninitialized).
  static void mulhilo(__m512i m, __m512i x, __m512i* hi, __m512i* lo) {
    const __mmask8 all = 0xff;
    const __m512i even = _mm512_mask_mul_epu32(x, all, x, m);
    const __m512i odd = _mm512_mask_mul_epu32(x, all, _mm512_mask_srli_epi64(x, all, x, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_mask_slli_epi64(odd, all, odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_mask_srli_epi64(even, all, even, 32), odd);
  }

  // w_l lane t = word l of counter t -> e[k] lane m = word l = m % 4 of counter 4k + m / 4: two
  // two-source permutes per output (words 0/1 and 2/3 of those counters) and a blend of their lanes.
  static void in_element_order(__m512i w0, __m512i w1, __m512i w2, __m512i w3, __m512i e[4]) {
    // lane m: counter m / 4 of the first source (l even) or of the second (l odd, + 16)
    const __m512i base = _mm512_setr_epi32(0, 16, 0, 16, 1, 17, 1, 17, 2, 18, 2, 18, 3, 19, 3, 19);
    for (int k = 0; k < 4; ++k) {
      const __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(4 * k));
      const __m512i words01 = _mm512_permutex2var_epi32(w0, idx, w1);
      const __m512i words23 = _mm512_permutex2var_epi32(w2, idx, w3);
      e[k] = _mm512_mask_blend_epi32(0xCCCC, words01, words23);  // lanes with l = 2, 3 from w2 / w3
    }
  }

  __m512i k0_[kRounds], k1_[kRounds];
};
