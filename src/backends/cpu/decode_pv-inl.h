// The P V tiles of the decode kernel (included inside namespace attn::cpu::<isa>, after
// decode_scores-inl.h and before attention_decode-inl.h, which uses them).

// o_r[0, NC * W) += sum_{j < W} p_r[j] v_j[0, NC * W) for RB rows (p_r = p + r * W, o_r = o + r *
// ldo, v_j = v0 + j * ldv): RB x NC vectors of O in registers, each V vector loaded (and widened)
// once for the RB rows, each V row read front to back (measured: a column-first order across the W
// rows, vector c of every row before vector c + 1, halved the bandwidth). The block's sum starts
// from 0 and is added to O once: O then carries Lk / W roundings instead of Lk (at Lk = 1000 a
// plain running sum misses the 1e-6 bound).
// Lanes of (even, odd) interleaved: lane l of the result is even[l / 2 + H] for even l, odd[l / 2 +
// H] for odd l (H = 0: the first half of the columns, H = W / 2: the second).
template <int H, int... L>
inline vf interleave(vf even, vf odd, std::integer_sequence<int, L...>) {
  return shuffle2<((L & 1) ? W + H + L / 2 : H + L / 2)...>(even, odd);
}

// pv_tile for bf16 V, NC even: each load of 2W elements, as W pair words, gives the even elements
// (low halves shifted up) and the odd ones (high halves masked) as two f32 vectors, without the
// widening shuffles of load_elems (two of them and an insert per W elements held the decode at half
// the read bandwidth). The column sums are the same FMAs in the same order as pv_tile's, interleaved
// back once, when added to O: the same bits.
template <int RB, int NC>
inline void pv_tile_pairs(const float* p, const uint16_t* v0, int64_t ldv, float* o, int64_t ldo,
                          AheadLines* ahead) {
  constexpr int NP = NC / 2;
  constexpr auto lanes = std::make_integer_sequence<int, W>{};
  vf even[RB][NP], odd[RB][NP];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int x = 0; x < NP; ++x) even[r][x] = odd[r][x] = vf{};
  }
  for (int j = 0; j < W; ++j) {
    if (j % kAheadSteps<uint16_t> == 0) ahead->step();
    const uint16_t* vr = v0 + j * ldv;
    vf lo[NP], hi[NP];
#pragma GCC unroll 4
    for (int x = 0; x < NP; ++x) {
      const PairHalves h = load_pair_halves(vr + x * 2 * W);
      lo[x] = h.even, hi[x] = h.odd;
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const vf pj = splat(p[r * W + j]);
#pragma GCC unroll 4
      for (int x = 0; x < NP; ++x) {
        even[r][x] += pj * lo[x];
        odd[r][x] += pj * hi[x];
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int x = 0; x < NP; ++x) {
      float* out = o + r * ldo + x * 2 * W;
      store(out, load(out) + interleave<0>(even[r][x], odd[r][x], lanes));
      store(out + W, load(out + W) + interleave<W / 2>(even[r][x], odd[r][x], lanes));
    }
  }
}

template <int RB, int NC, class T>
inline void pv_tile(const float* p, const T* v0, int64_t ldv, float* o, int64_t ldo,
                    AheadLines* ahead) {
  if constexpr (std::is_same_v<T, uint16_t> && NC % 2 == 0) {
    return pv_tile_pairs<RB, NC>(p, v0, ldv, o, ldo, ahead);
  }
  vf acc[RB][NC];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 8
    for (int x = 0; x < NC; ++x) acc[r][x] = vf{};
  }
  for (int j = 0; j < W; ++j) {
    if (j % kAheadSteps<T> == 0) ahead->step();
    const T* vr = v0 + j * ldv;
    vf vv[NC];
#pragma GCC unroll 8
    for (int x = 0; x < NC; ++x) vv[x] = load_elems(vr + x * W);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const vf pj = splat(p[r * W + j]);
#pragma GCC unroll 8
      for (int x = 0; x < NC; ++x) acc[r][x] += pj * vv[x];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 8
    for (int x = 0; x < NC; ++x) store(o + r * ldo + x * W, load(o + r * ldo + x * W) + acc[r][x]);
  }
}

// Vectors of O a P V tile keeps in registers: half the register file.
inline constexpr int kPvAcc = W == 16 ? 16 : 8;

// O rows [0, RB) (ld ldo) += P rows (ld W) times the W rows of V from v0: tiles of RB rows x
// up to kPvAcc / RB vectors, then the last Dv % W columns.
template <int RB, class T>
inline void pv_rows(const float* p, const T* v0, int64_t ldv, int64_t Dv, float* o, int64_t ldo,
                    AheadLines* ahead) {
  constexpr int kMaxNC = std::min(8, kPvAcc / RB);
  const int64_t nv = Dv / W;
  int64_t x = 0;
  if constexpr (kMaxNC >= 8) {
    for (; x + 8 <= nv; x += 8) pv_tile<RB, 8>(p, v0 + x * W, ldv, o + x * W, ldo, ahead);
  }
  if constexpr (kMaxNC >= 4) {
    for (; x + 4 <= nv; x += 4) pv_tile<RB, 4>(p, v0 + x * W, ldv, o + x * W, ldo, ahead);
  }
  for (; x + 2 <= nv; x += 2) pv_tile<RB, 2>(p, v0 + x * W, ldv, o + x * W, ldo, ahead);
  for (; x < nv; ++x) pv_tile<RB, 1>(p, v0 + x * W, ldv, o + x * W, ldo, ahead);
  if (nv * W < Dv) {
    const int64_t c = nv * W;
    for (int r = 0; r < RB; ++r) {
      vf acc = vf{};
      for (int j = 0; j < W; ++j) {
        acc += splat(p[r * W + j]) * load_elems_tail(v0 + j * ldv + c, Dv - c);
      }
      store(o + r * ldo + c, load(o + r * ldo + c) + acc);
    }
  }
}

// The max of the lanes of x, NaN when a lane is NaN (every step keeps a NaN of either side): a
// shuffle tree of log2(W) steps instead of W scalar compares.
template <int S, int... L>
inline vf max_step(vf x, std::integer_sequence<int, L...>) {
#if defined(__clang__)
  const vf y = __builtin_shufflevector(x, x, (L ^ S)...);
#else
  const vf y = __builtin_shuffle(x, vi{(L ^ S)...});
#endif
  return ((x > y) | (x != x)) ? x : y;
}
inline float hmax_nan(vf x) {
  constexpr auto lanes = std::make_integer_sequence<int, W>{};
  if constexpr (W >= 16) x = max_step<8>(x, lanes);
  if constexpr (W >= 8) x = max_step<4>(x, lanes);
  x = max_step<2>(x, lanes);
  x = max_step<1>(x, lanes);
  return x[0];
}

// The head dims (D = Dv) whose single query rows take Decode::row_blocks: multiples of every target's
// step, the common ones (each instantiation is 3-12 KB of code per target and element type).
inline constexpr std::integer_sequence<int, 64, 96, 128, 256> kRowLoopDims{};
