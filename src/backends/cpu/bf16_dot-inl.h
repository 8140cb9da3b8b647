// Products of bf16 inputs on VDPBF16PS (AVX512_BF16). Included inside namespace attn::cpu::<isa>
// after online_softmax-inl.h; only the avx512bf16 target (isa_avx512bf16.cc) defines
// ATTN_CPU_BF16_DOT, every other target gets kBf16Dot = false and converts bf16 to f32 instead.
//
// A pair is two bf16 values in one 32-bit word, the one at the lower address in the low half.
// VDPBF16PS multiplies two vectors of 16 pairs lane by lane and adds both products to the f32 lane,
//   c[l] += a[l].lo * b[l].lo + a[l].hi * b[l].hi
// (exact products, f32 sums, round to nearest; denormal inputs and results are flushed to zero), so
// the reduction dimension of a product is walked in pairs:
//   S  = Q K^T : A = Q rows as pairs [rows x D2] (broadcast), B = K^T in panels of pairs
//                [keys / W][D2][W] (transpose_to_panel of the rows' words), D2 = ceil(D / 2)
//   O += P V   : A = P rounded to bf16 pairs [rows x keys / 2], B = V pair-interleaved
//                [keys / 2][Dvp] with word (t, c) = V[2t][c] | V[2t + 1][c] << 16
// One instruction does the work of two f32 FMAs on inputs that are bf16 already. P is rounded to
// bf16 before P V, as a plain bf16 implementation does (FlashAttention's yardstick); the running
// max, the sums and O stay f32.

#if defined(ATTN_CPU_BF16_DOT)

inline constexpr bool kBf16Dot = true;

// The micro-tiles' operands as bf16 pairs (microkernels-inl.h): B vectors of 16 pair words, an A
// pair in every lane, VDPBF16PS as the multiply-accumulate.
struct PairOperands {
  using A = uint32_t;
  using B = uint32_t;
  static vu load_b(const uint32_t* p) { return load_words(p); }
  static vu broadcast(uint32_t a) { return vu{} + a; }
  static vf madd(vf acc, vu a, vu b) { return dot_pairs(acc, a, b); }
};

// C[M x N] (=, +=) A[M x K2 pairs] B[K2 pairs x N], N a multiple of W; strides as in gemm.
template <bool kAccumulate>
void gemm_pairs(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t ars, int64_t acs,
                const uint32_t* B, int64_t ldb, int64_t bcs, float* Cm, int64_t ldc,
                const Band& band = {}) {
  if constexpr (kAmx) {
    // Row-major A on AMX tiles (the backward transposes P^T and dS^T for them); the diagonal tiles
    // of a causal or windowed rule, whose bands are per 6-row block, stay on VDPBF16PS.
    if (acs == 1 && band.n_end == nullptr && band.k_end == nullptr) {
      gemm_tiles<kAccumulate>(M, N, K2, A, ars, B, ldb, bcs, Cm, ldc);
      return;
    }
  }
  gemm_blocked<PairOperands, kAccumulate>(M, N, K2, A, ars, acs, B, ldb, bcs, Cm, ldc, band);
}

// One bf16 row of n values as ceil(n / 2) pairs; an odd n gets a zero high half in its last word.
inline void load_pairs(const char* row, int64_t n, uint32_t* dst) {
  std::memcpy(dst, row, static_cast<size_t>(n) * 2);
  if (n % 2 != 0) reinterpret_cast<uint16_t*>(dst)[n] = 0;
}

// Rows [r0, r0 + n) of (b, h) of x (bf16 [B, H, L, cols]) as panels of pairs: dst[(j / W) * (D2 *
// W) + c * W + j % W] = pair c of row r0 + j, zero for n <= j < round_up(n, W). Rows with an even
// count that start on a 4-byte boundary are read in place as words; tmp [W x D2] holds padded or
// realigned copies of the others (a view may start at any bf16 element).
inline void pack_pair_panels(const View4& x, int64_t b, int64_t h, int64_t r0, int64_t n,
                             int64_t cols, uint32_t* dst, uint32_t* tmp) {
  const int64_t np = round_up(n, W), c2 = (cols + 1) / 2;
  for (int64_t jb = 0; jb < np; jb += W) {
    const int64_t rows = std::min<int64_t>(W, n - jb);
    const uint32_t* src[W];
    for (int64_t l = 0; l < rows; ++l) {
      const char* row = x.row(b, h, r0 + jb + l);
      if (cols % 2 == 0 && reinterpret_cast<uintptr_t>(row) % alignof(uint32_t) == 0) {
        src[l] = reinterpret_cast<const uint32_t*>(row);
      } else {
        load_pairs(row, cols, tmp + l * c2);
        src[l] = tmp + l * c2;
      }
    }
    transpose_to_panel(src, rows, c2, dst + jb * c2);
  }
}

#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_SOFT_BF16)
// 32 columns [c, c + 32) of two rows ra, rb as 32 pair words at out (AVX-512BW): two VPERMT2W
// interleave the halves, and the inf / NaN check runs on the 16-bit halves as they were read (a
// mask of 32 per row) instead of on the widened words (it was most of the packing's time). Returns
// whether a half was inf or NaN; with sanitize those halves are packed as 0.
inline bool pack_pairs_32(const uint16_t* ra, const uint16_t* rb, bool sanitize, uint32_t* out) {
  const __m512i exponent = _mm512_set1_epi16(0x7f80);
  __m512i a = _mm512_loadu_si512(ra), bh = _mm512_loadu_si512(rb);
  const __mmask32 bad_a = _mm512_cmpeq_epi16_mask(_mm512_and_si512(a, exponent), exponent);
  const __mmask32 bad_b = _mm512_cmpeq_epi16_mask(_mm512_and_si512(bh, exponent), exponent);
  const bool bad = (bad_a | bad_b) != 0;
  if (bad && sanitize) {
    a = _mm512_maskz_mov_epi16(~bad_a, a);
    bh = _mm512_maskz_mov_epi16(~bad_b, bh);
  }
  // Half 2j of the result from a[j], half 2j + 1 from b[j] (index 32 + j: the second source).
  alignas(64) static constexpr uint16_t kLow[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                    37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                    11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                     53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                     27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_load_si512(kHigh);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi16(a, low, bh));
  _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi16(a, high, bh));
  return bad;
}
#endif

// Rows [r0, r0 + n) of (b, h) of v (bf16 [B, H, L, Dv]) pair-interleaved: dst[t * Dvp + c] = v[r0 +
// 2t][c] | v[r0 + 2t + 1][c] << 16 (zero beyond n and beyond Dv). An inf or NaN value is packed as 0
// and the result says whether there was one: add_nonfinite_values then adds those values' terms.
// With sanitize false the words are the values as they are (the backward's Q and dO rows, where a
// NaN or inf must reach the gradients as it does in f32).

inline bool pack_value_pairs(const View4& v, int64_t b, int64_t h, int64_t r0, int64_t n,
                             int64_t Dv, int64_t Dvp, uint32_t* dst, bool sanitize = true) {
  vi nonfinite = vi{};
  [[maybe_unused]] bool nonfinite_pairs = false;
  for (int64_t t = 0; 2 * t < n; ++t) {
    const auto* ra = reinterpret_cast<const uint16_t*>(v.row(b, h, r0 + 2 * t));
    const auto* rb =
        2 * t + 1 < n ? reinterpret_cast<const uint16_t*>(v.row(b, h, r0 + 2 * t + 1)) : nullptr;
    int64_t c0 = 0;
#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_SOFT_BF16)
    if (rb != nullptr) {
      for (; c0 + 2 * W <= Dv; c0 += 2 * W)
        nonfinite_pairs |= pack_pairs_32(ra + c0, rb + c0, sanitize, dst + t * Dvp + c0);
    }
#endif
    for (int64_t c = c0; c < Dvp; c += W) {
      vh lo = vh{}, hi = vh{};
      if (c + W <= Dv) {
        lo = *reinterpret_cast<const vh_mem*>(ra + c);
        if (rb != nullptr) hi = *reinterpret_cast<const vh_mem*>(rb + c);
      } else {
        for (int64_t l = 0; l < Dv - c; ++l) {
          lo[l] = ra[c + l];
          hi[l] = rb != nullptr ? rb[c + l] : uint16_t{0};
        }
      }
      vu word = __builtin_convertvector(lo, vu) | (__builtin_convertvector(hi, vu) << 16);
      // A half is inf or NaN when its 8 exponent bits are all set.
      const vi bad_lo = (word & 0x7f80u) == 0x7f80u;
      const vi bad_hi = (word & 0x7f800000u) == 0x7f800000u;
      if (sanitize) {
        word &=
            ~(__builtin_bit_cast(vu, bad_lo) & 0xffffu) & ~(__builtin_bit_cast(vu, bad_hi) << 16);
      }
      nonfinite |= bad_lo | bad_hi;
      *reinterpret_cast<vf_mem*>(dst + t * Dvp + c) = __builtin_bit_cast(vf, word);
    }
  }
  for (int l = 0; l < W; ++l) {
    if (nonfinite[l] != 0) return true;
  }
  return nonfinite_pairs;
}

// The terms that pack_value_pairs left out: pv[r][c] += p[r][j] * v[r0 + j][c] for every inf or NaN
// v and every nonzero weight p (the bf16 pairs P V multiplied, pp [nr x ldp] pairs). A zero weight
// (a removed or dropped key) never meets such a value, so it cannot turn the row into NaN; any
// other weight makes the sum inf or NaN whatever the order, as IEEE arithmetic does. Rare: only
// tiles whose values hold inf or NaN come here.
inline void add_nonfinite_values(const View4& v, int64_t b, int64_t h, int64_t r0, int64_t n,
                                 int64_t Dv, const uint32_t* pp, int64_t ldp, int64_t nr, float* pv,
                                 int64_t ldo) {
  for (int64_t j = 0; j < n; ++j) {
    const auto* row = reinterpret_cast<const uint16_t*>(v.row(b, h, r0 + j));
    for (int64_t c = 0; c < Dv; ++c) {
      if ((row[c] & 0x7f80u) != 0x7f80u) continue;
      const float value = std::bit_cast<float>(static_cast<uint32_t>(row[c]) << 16);
      for (int64_t r = 0; r < nr; ++r) {
        const uint32_t pair = pp[r * ldp + j / 2];
        const float weight = std::bit_cast<float>(j % 2 == 0 ? pair << 16 : pair & 0xffff0000u);
        if (weight != 0.0f) pv[r * ldo + c] += weight * value;
      }
    }
  }
}

// Rounds n floats (n a multiple of W) to bf16 pairs: dst[j / 2] = bf16(s[j]) | bf16(s[j + 1])
// << 16.
inline void round_to_pairs(const float* s, int64_t n, uint32_t* dst) {
  auto* halves = reinterpret_cast<uint16_t*>(dst);  // pair t = halves 2t (low) and 2t + 1 (high)
  for (int64_t j = 0; j < n; j += W) *reinterpret_cast<vh_mem*>(halves + j) = to_bf16(load(s + j));
}

// Rounds rows of x (f32 [nr x n], row stride ldx, n a multiple of W) to bf16 and interleaves
// consecutive rows: dst[t * ldd + j] = bf16(x[2t][j]) | bf16(x[2t + 1][j]) << 16, the missing row
// of an odd nr as 0. This is the A operand of a product that reduces over rows (dV += P^T dO,
// dK += dS^T Q: A[key j][row pair t] at j + t * ldd).
inline void interleave_rows_to_pairs(const float* x, int64_t ldx, int64_t nr, int64_t n,
                                     uint32_t* dst, int64_t ldd) {
  for (int64_t t = 0; 2 * t < nr; ++t) {
    const float* lo = x + 2 * t * ldx;
    const float* hi = 2 * t + 1 < nr ? lo + ldx : nullptr;
    for (int64_t j = 0; j < n; j += W) {
      const vh l = to_bf16(load(lo + j));
      const vh h = hi != nullptr ? to_bf16(load(hi + j)) : vh{};
      const vu word = __builtin_convertvector(l, vu) | (__builtin_convertvector(h, vu) << 16);
      *reinterpret_cast<vf_mem*>(dst + t * ldd + j) = __builtin_bit_cast(vf, word);
    }
  }
}

#else

inline constexpr bool kBf16Dot = false;

#endif
