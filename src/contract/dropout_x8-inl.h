// The dropout rule's Philox4x32-10 draws (contract/dropout.h) for 8 consecutive counters at once on
// AVX2, bit for bit Random123's (the AVX-512 form, 16 at once, is dropout_x16-inl.h).
//
// Included inside a per-ISA namespace, after its target pragma, by AVX2 targets (a vector width of
// 8 floats): src/backends/cpu/online_softmax-inl.h and src/nn/elementwise_dropout-inl.h. No include
// guard: each instruction set's namespace gets its own copy.

// Philox4x32-10 under one key for the 8 counters (c0 + t, c1, c2, c3), t = 0..7.
class PhiloxX8 {
 public:
  explicit PhiloxX8(uint64_t seed) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < kRounds; ++r) {  // round r uses the key bumped r times
      k0_[r] = _mm256_set1_epi32(static_cast<int>(k0));
      k1_[r] = _mm256_set1_epi32(static_cast<int>(k1));
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  // The 32 draws of the counters in element order (element 4t + l = word l of counter t, as
  // DropoutRule::draws4 numbers them): e[k] holds elements 8k .. 8k + 7.
  void draws(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, __m256i e[4]) const {
    __m256i x0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c0)),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i x1 = _mm256_set1_epi32(static_cast<int>(c1));
    __m256i x2 = _mm256_set1_epi32(static_cast<int>(c2));
    __m256i x3 = _mm256_set1_epi32(static_cast<int>(c3));
    const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
    for (int r = 0; r < kRounds; ++r) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo(m0, x0, &hi0, &lo0);
      mulhilo(m1, x2, &hi1, &lo1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), k0_[r]);
      x1 = lo1;
      x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), k1_[r]);
      x3 = lo0;
    }
    in_element_order(x0, x1, x2, x3, e);
  }

  // All-ones lanes where the draw is >= threshold (unsigned), zero elsewhere.
  static __m256i kept(__m256i draw, __m256i threshold) {
    return _mm256_cmpeq_epi32(_mm256_max_epu32(draw, threshold), draw);
  }

 private:
  static constexpr int kRounds = 10;

  // hi:lo = m * x per 32-bit lane (64-bit products of the even lanes, then of the odd ones).
  static void mulhilo(__m256i m, __m256i x, __m256i* hi, __m256i* lo) {
    const __m256i even = _mm256_mul_epu32(x, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }

  // w_l lane t = word l of counter t -> e[k] lane m = word m % 4 of counter 2k + m / 4: a 4 x 4
  // transpose inside each 128-bit half, then the halves paired.
  static void in_element_order(__m256i w0, __m256i w1, __m256i w2, __m256i w3, __m256i e[4]) {
    const __m256i a0 = _mm256_unpacklo_epi32(w0, w1), a1 = _mm256_unpackhi_epi32(w0, w1);
    const __m256i a2 = _mm256_unpacklo_epi32(w2, w3), a3 = _mm256_unpackhi_epi32(w2, w3);
    // u_m, half h: the four words of counter 4h + m
    const __m256i u0 = _mm256_unpacklo_epi64(a0, a2), u1 = _mm256_unpackhi_epi64(a0, a2);
    const __m256i u2 = _mm256_unpacklo_epi64(a1, a3), u3 = _mm256_unpackhi_epi64(a1, a3);
    e[0] = _mm256_permute2x128_si256(u0, u1, 0x20);  // counters 0, 1
    e[1] = _mm256_permute2x128_si256(u2, u3, 0x20);  // 2, 3
    e[2] = _mm256_permute2x128_si256(u0, u1, 0x31);  // 4, 5
    e[3] = _mm256_permute2x128_si256(u2, u3, 0x31);  // 6, 7
  }

  __m256i k0_[kRounds], k1_[kRounds];
};
