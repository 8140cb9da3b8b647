// The decode forward's scores (included inside namespace attn::cpu::<isa> before
// attention_decode-inl.h, which uses them): K and V elements as f32 vectors, the query rows in the
// form each product takes (f32 rows, bf16 pairs for VDPBF16PS, f32 rows split by pairs for bf16 K
// without it), and the dot products of RB rows with a block of W keys, reduced by a transpose-add.

// Elements of a K or V row as f32 vectors: float in place, bf16 widened by a shift.
inline vf load_elems(const float* x) {
  return load(x);
}
inline vf load_elems(const uint16_t* x) {
  const vh h = *reinterpret_cast<const vh_mem*>(x);
  return __builtin_bit_cast(vf, __builtin_convertvector(h, vu) << 16);
}
// int8 (quantized caches) widened exactly; the scales are applied to scores and P, not here. GCC 12
// turns __builtin_convertvector from int8 into a scalar load and convert per element (the int8
// decode ran at 3 GB/s, Zen 5): sign extensions by intrinsic where the target has them.
typedef int8_t vc_mem __attribute__((vector_size(W), aligned(1), may_alias));
typedef int8_t vc __attribute__((vector_size(W)));
inline vf load_elems(const int8_t* x) {
#if ATTN_CPU_WIDTH == 16 && !defined(ATTN_CPU_SOFT_BF16)
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  // (the masked form: the plain one trips GCC 12's -Wuninitialized inside its own header)
  return __builtin_convertvector(__builtin_bit_cast(vi, _mm512_maskz_cvtepi8_epi32(0xffff, c)), vf);
#elif ATTN_CPU_WIDTH == 8
  const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x));
  return __builtin_convertvector(__builtin_bit_cast(vi, _mm256_cvtepi8_epi32(c)), vf);
#else
  return __builtin_convertvector(static_cast<vc>(*reinterpret_cast<const vc_mem*>(x)), vf);
#endif
}
inline float elem_to_f32(float x) {
  return x;
}
inline float elem_to_f32(int8_t x) {
  return static_cast<float>(x);
}
inline float elem_to_f32(uint16_t x) {
  return bf16_to_f32(x);
}
// The last n < W elements of a row (zero beyond): never reads past the row.
template <class T>
inline vf load_elems_tail(const T* x, int64_t n) {
  vf r = vf{};
  for (int64_t l = 0; l < n; ++l) r[l] = elem_to_f32(x[l]);
  return r;
}

// One step of the transpose-add at lane distance S: lane l of the result adds lanes l and l ^ S of
// a (when bit S of l is clear) or of b (when set), so each aligned group of S lanes keeps the
// partial sums of one of the two vectors.
template <int S, int... L>
inline vf sum_pair(vf a, vf b, std::integer_sequence<int, L...>) {
  return shuffle2<((L & S) ? W + L : L)...>(a, b) +
         shuffle2<((L & S) ? W + (L ^ S) : (L ^ S))...>(a, b);
}

// N vectors in x (clobbered) folded into one by log2(N) steps of sum_pair at lane distances S, S / 2,
// ..., S / (N / 2), each pairing x[i] with x[i + N / 2] of the vectors still live. fold<W, W / 2>
// is the whole transpose-add: lane j of the result = the sum of the lanes of x[j], W - 1 adds of
// two two-source shuffles instead of W horizontal sums. Every lane's sum runs the same tree
// whichever vectors share a step, so the transpose-add can be cut into a first part per group of
// vectors and the rest (dot_block).
template <int N, int S>
[[gnu::always_inline]] inline vf fold(vf* x) {
  if constexpr (N == 1) {
    return x[0];
  } else {
    constexpr auto lanes = std::make_integer_sequence<int, W>{};
#pragma GCC unroll 8
    for (int i = 0; i < N / 2; ++i) x[i] = sum_pair<S>(x[i], x[i + N / 2], lanes);
    return fold<N / 2, S / 2>(x);
  }
}

// W vectors in, one out: lane j = the sum of the lanes of x[j] (x is clobbered).
inline vf transpose_sum(vf x[W]) {
  return fold<W, W / 2>(x);
}

// The query rows of dot_block and the product they take with a key: f32 rows against K widened to
// f32 (FMA, W elements a step), or, on VDPBF16PS for bf16 K, the rows' bf16 values against K in
// pairs (32 elements a step instead of two widenings and two FMAs; each lane sums exact products in
// f32, denormal inputs flushed as in the tiled forward on this target). Rows are zero-padded to a
// multiple of the step (ld elements apart); load_k_tail reads the last D % kStep elements of a key,
// never past the row.
template <class T>
struct F32Queries {
  static constexpr int64_t kStep = W;
  const float* q;
  int64_t ld;
  static vf load_k(const T* k) { return load_elems(k); }
  static vf load_k_tail(const T* k, int64_t n) { return load_elems_tail(k, n); }
  vf load_q(int r, int64_t d) const { return load(q + r * ld + d); }
  static vf madd(vf acc, vf qv, vf kv) { return acc + qv * kv; }
};

#if defined(ATTN_CPU_BF16_DOT)
struct PairQueries {
  static constexpr int64_t kStep = 32;
  const uint16_t* q;
  int64_t ld;
  static vu load_k(const uint16_t* k) { return load_words(reinterpret_cast<const uint32_t*>(k)); }
  static vu load_k_tail(const uint16_t* k, int64_t n) {
    alignas(64) uint16_t tail[32] = {};
    std::memcpy(tail, k, static_cast<size_t>(n) * 2);
    return load_words(reinterpret_cast<const uint32_t*>(tail));
  }
  vu load_q(int r, int64_t d) const {
    return load_words(reinterpret_cast<const uint32_t*>(q + r * ld + d));
  }
  static vf madd(vf acc, vu qv, vu kv) { return dot_pairs(acc, qv, kv); }
};
#endif

// 2W bf16 elements from x as W pair words, split into the even elements (low halves shifted up) and
// the odd ones (high halves masked) as f32 vectors: K's scores (SplitQueries) and V's P V tile
// (pv_tile_pairs) both take bf16 this way.
struct PairHalves {
  vf even, odd;
};
inline PairHalves load_pair_halves(const uint16_t* x) {
  const vu w = load_words(reinterpret_cast<const uint32_t*>(x));
  return {__builtin_bit_cast(vf, w << 16), __builtin_bit_cast(vf, w & 0xffff0000u)};
}

#if !defined(ATTN_CPU_BF16_DOT)
// bf16 K without VDPBF16PS: the rows split by pairs (each block of 2W elements as its W even elements,
// then its W odd ones) against K loaded as W pair words, the even elements shifted up and the odd ones
// masked: one load, one shift and one AND per 2W elements of a key instead of two widenings of W
// (pv_tile_pairs takes V the same way). Lane l sums elements 2l and 2l + 1 of each block, in order of d.
struct SplitQueries {
  static constexpr int64_t kStep = 2 * W;
  const float* q;  // [rows x ld], ld a multiple of 2W
  int64_t ld;
  static PairHalves load_k(const uint16_t* k) { return load_pair_halves(k); }
  static PairHalves load_k_tail(const uint16_t* k, int64_t n) {
    alignas(64) uint16_t tail[2 * W] = {};
    std::memcpy(tail, k, static_cast<size_t>(n) * 2);
    return load_pair_halves(tail);
  }
  PairHalves load_q(int r, int64_t d) const {
    return {load(q + r * ld + d), load(q + r * ld + d + W)};
  }
  static vf madd(vf acc, PairHalves qv, PairHalves kv) {
    return acc + qv.even * kv.even + qv.odd * kv.odd;
  }
};

// The f32 rows qf [R x Dp] as SplitQueries takes them, qs [R x Dp2] (Dp2 a multiple of 2W, zero
// beyond D).
inline void split_rows(const float* qf, int64_t Dp, int64_t D, int64_t R, float* qs, int64_t Dp2) {
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t d = 0; d < Dp2; ++d) {
      const int64_t block = d / (2 * W) * (2 * W), lane = d % W, odd = d % (2 * W) / W;
      const int64_t from = block + 2 * lane + odd;
      qs[r * Dp2 + d] = from < D ? qf[r * Dp + from] : 0.0f;
    }
  }
}
#endif

// acc[t][r] = the vector of partial sums of q_r . k_t over D (lane l: the elements d = l mod step,
// in order of d), for KB keys k_t = kj + t ldk and RB rows. The KB x RB sums are
// independent chains of D / step FMAs, interleaved so that their latencies overlap: one row's dot
// product alone is a single chain (16 dependent FMAs at D 128), whose latency, not the FMA rate,
// bounded decode with one query row per kv head. Each sum runs in the order it would alone.
// Always inlined: its KB x RB sums come back through acc, which stays in registers only inlined
// (GCC left the 2-row instance out of line, and the sums went through memory: 1.1-1.2x slower).
template <int RB, int KB, class Queries, class T>
[[gnu::always_inline]] inline void dot_keys(Queries q, int64_t D, const T* kj, int64_t ldk,
                                            vf (&acc)[KB][RB], AheadLines* ahead) {
  constexpr int64_t step = Queries::kStep;
  const int64_t Dfull = D / step * step;
#pragma GCC unroll 4
  for (int t = 0; t < KB; ++t) {
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) acc[t][r] = vf{};
  }
  auto madd_step = [&](int64_t d) {
    decltype(Queries::load_k(kj)) kv[KB];
#pragma GCC unroll 4
    for (int t = 0; t < KB; ++t) kv[t] = Queries::load_k(kj + t * ldk + d);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const auto qv = q.load_q(r, d);
#pragma GCC unroll 4
      for (int t = 0; t < KB; ++t) acc[t][r] = Queries::madd(acc[t][r], qv, kv[t]);
    }
  };
  // The prefetch advances once per kAheadSteps steps over D (prefetch_ahead.h says why).
  constexpr int kSteps = kAheadSteps<T>;
  int64_t d = 0;
  for (; d + kSteps * step <= Dfull; d += kSteps * step) {
    ahead->step();
#pragma GCC unroll 4
    for (int u = 0; u < kSteps; ++u) madd_step(d + u * step);
  }
  for (; d < Dfull; d += step) madd_step(d);
  if (Dfull < D) {
#pragma GCC unroll 4
    for (int t = 0; t < KB; ++t) {
      const auto kv = Queries::load_k_tail(kj + t * ldk + Dfull, D - Dfull);
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) acc[t][r] = Queries::madd(acc[t][r], q.load_q(r, Dfull), kv);
    }
  }
}

// Keys per dot_keys pass for RB rows: the most of 4, 2, 1 whose KB x RB accumulators, KB key
// operands and one query operand (each `regs` vectors: 2 for split pairs) fit the target's vector
// registers (16, or 32 with AVX-512) with two to spare. More keys per pass means each query vector
// loaded serves more FMAs: with one key per pass, four rows took five loads per four FMAs, and the
// f32 scores of a speculative-decoding step (Lq 4) ran at 2.7x the time of its P V (Zen 4).
template <int RB, int regs>
constexpr int keys_per_pass() {
  constexpr int budget = (W >= 16 ? 32 : 16) - 2;
  if (4 * RB * regs + 5 * regs <= budget) return 4;
  if (2 * RB * regs + 3 * regs <= budget) return 2;
  return 1;
}

// Lane j of the result = lane (j % KB) W / KB + j / KB of x: the order of the W keys after a
// block's passes of KB keys are folded (dot_block).
template <int KB, int... L>
inline vf keys_in_order(vf x, std::integer_sequence<int, L...>) {
  return shuffle2<((L % KB) * (W / KB) + L / KB)...>(x, x);
}

// Dot products of RB query rows (q: F32Queries or PairQueries) with nk <= W keys (rows of k0, ld
// ldk elements of D): dots[r * W + j] = q_r . k_j, 0 for j >= nk; keys_per_pass keys at a time.
// After each pass over a whole block the KB vectors of a row are folded (the transpose-add's first
// log2(KB) steps, fold) into one whose lanes hold the KB keys' partial sums W / KB lanes each, so
// the stack array between the passes holds W / KB vectors per row instead of W. Every key's sum
// runs the same tree whichever keys share a step, so only the lanes' order changes, put right by
// one permute per row (keys_in_order): the same bits as the transpose-add of the W vectors. Only
// with passes of 4 keys: with 2 (4 rows on AVX2) the folded passes ran 3-8% slower.
template <int RB, class Queries, class T>
inline void dot_block(Queries q, int64_t D, const T* k0, int64_t ldk, int64_t nk, float* dots,
                      AheadLines* ahead) {
  constexpr int regs = static_cast<int>(sizeof(decltype(Queries::load_k(k0))) / sizeof(vf));
  constexpr int KB = keys_per_pass<RB, regs>();
  if constexpr (KB >= 4) {
    if (nk == W) {
      constexpr int kPasses = W / KB;
      vf folded[RB][kPasses];
#pragma GCC unroll 4
      for (int pass = 0; pass < kPasses; ++pass) {
        vf acc[KB][RB];
        dot_keys<RB, KB>(q, D, k0 + pass * KB * ldk, ldk, acc, ahead);
#pragma GCC unroll 4
        for (int r = 0; r < RB; ++r) {
          vf keys[KB];
#pragma GCC unroll 4
          for (int t = 0; t < KB; ++t) keys[t] = acc[t][r];
          folded[r][pass] = fold<KB, W / 2>(keys);
        }
      }
      constexpr auto lanes = std::make_integer_sequence<int, W>{};
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r)
        store(dots + r * W, keys_in_order<KB>(fold<kPasses, kPasses / 2>(folded[r]), lanes));
      return;
    }
  }
  // Keys in order, KB at a time, then one by one, their sums kept apart until the transpose-add.
  vf part[RB][W];
  const auto keys_from = [&]<int kKeys>(int64_t j) {
    vf acc[kKeys][RB];
    dot_keys<RB, kKeys>(q, D, k0 + j * ldk, ldk, acc, ahead);
#pragma GCC unroll 4
    for (int t = 0; t < kKeys; ++t) {
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) part[r][j + t] = acc[t][r];
    }
  };
  int64_t j = 0;
  for (; j + KB <= nk; j += KB) keys_from.template operator()<KB>(j);
  for (; j < nk; ++j) keys_from.template operator()<1>(j);
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    for (int64_t jj = nk; jj < W; ++jj) part[r][jj] = vf{};
    store(dots + r * W, transpose_sum(part[r]));
  }
}

// The W dot products of one query row with a whole block of W keys (rows of k0, ld ldk) at a head
// dim kD known when compiled, a multiple of the step: lane j = q . k_j. The W chains sit in
// registers (dot_block keeps W / KB folded ones per row in a stack array), each in the order dot_keys
// runs it (the same bits), in passes of 4 keys over the whole of D that read K row by row, as
// dot_block's: one step of D across all W rows at a time read bf16 K from memory 4-6% slower (Zen 4,
// 2 threads, 32 heads x 32768 keys). The prefetch steps as often as in dot_block.
template <int kD, class Queries, class T>
inline vf dot_whole_block(Queries q, const T* k0, int64_t ldk, AheadLines* ahead) {
  constexpr int64_t step = Queries::kStep;
  static_assert(kD % step == 0, "whole steps only");
  vf part[W];
#pragma GCC unroll 16
  for (int t = 0; t < W; ++t) part[t] = vf{};
  constexpr int KB = W < 4 ? W : 4;
#pragma GCC unroll 4
  for (int t0 = 0; t0 < W; t0 += KB) {
#pragma GCC unroll 8
    for (int64_t d = 0; d < kD; d += step) {
      if (d % (kAheadSteps<T> * step) == 0) ahead->step();
      const auto qv = q.load_q(0, d);
#pragma GCC unroll 4
      for (int t = t0; t < t0 + KB; ++t)
        part[t] = Queries::madd(part[t], qv, Queries::load_k(k0 + t * ldk + d));
    }
  }
  return transpose_sum(part);
}

// The query rows of the R = 1 decode step as dot_rows hands them to the products (f32 rows; for
// bf16 K the rows' bf16 values on VDPBF16PS, else the f32 rows split by pairs).
template <int kD, class T>
inline vf dot_row_block(const float* qf, const float* qk, const T* k0, int64_t ldk,
                        AheadLines* ahead) {
  if constexpr (std::is_same_v<T, uint16_t>) {
#if defined(ATTN_CPU_BF16_DOT)
    const PairQueries row{reinterpret_cast<const uint16_t*>(qk), 0};
#else
    const SplitQueries row{qk, 0};
#endif
    return dot_whole_block<kD>(row, k0, ldk, ahead);
  } else {
    (void)qk;
    return dot_whole_block<kD>(F32Queries<T>{qf, 0}, k0, ldk, ahead);
  }
}

// The step of the bf16-K rows (Decode::Buffers::qk): 32 bf16 values for VDPBF16PS, else 2W.
#if defined(ATTN_CPU_BF16_DOT)
inline constexpr int64_t kBf16KStep = 32;
#else
inline constexpr int64_t kBf16KStep = 2 * W;
#endif

// Scores of RB rows against a block of keys: f32 K from the f32 rows qf (ld Dp); bf16 K from qk (ld
// Dp2, a multiple of kBf16KStep), the rows' bf16 values on VDPBF16PS where the target has it, else
// the f32 rows split by pairs.
template <int RB, class T>
inline void dot_rows(const float* qf, int64_t Dp, const float* qk, int64_t Dp2, int64_t D,
                     const T* k0, int64_t ldk, int64_t nk, float* dots, AheadLines* ahead) {
  if constexpr (std::is_same_v<T, uint16_t>) {
#if defined(ATTN_CPU_BF16_DOT)
    const PairQueries rows{reinterpret_cast<const uint16_t*>(qk), 2 * Dp2};  // a row per Dp2 floats
#else
    const SplitQueries rows{qk, Dp2};
#endif
    dot_block<RB>(rows, D, k0, ldk, nk, dots, ahead);
  } else {
    (void)qk, (void)Dp2;
    dot_block<RB>(F32Queries<T>{qf, Dp}, D, k0, ldk, nk, dots, ahead);
  }
}
