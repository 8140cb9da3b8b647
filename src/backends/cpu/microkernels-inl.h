// Register-blocked matrix products of the cpu backend (included inside namespace attn::cpu::<isa>,
// after simd-inl.h). Every product of attention, forward and backward, is one shape of
//
//   C[M x N] (= or +=) A[M x K] * B[K x N]
//
// A is read through two strides (ars between rows, acs between k) and broadcast one element at a
// time, so it may be a matrix or a transposed view (P^T, dS^T) without a copy. B is read as vectors
// of W columns: column vector c of row k sits at B + c * bcs + k * ldb, so B is either row-major
// (bcs = W, ldb = row length) or packed in column panels of W (bcs = K * W, ldb = W: K^T and V^T,
// see pack_panels, whose packing is a vector transpose). N is a multiple of W (packed tiles are
// zero-padded); C is row-major (ldc). The micro-tile keeps RM x CM vectors of C in registers: per k
// it loads CM vectors of B and broadcasts RM elements of A.
//
// The six products (A, then B):
//   S  = Q K^T    A = Q [rows x D]                         B = K^T in panels [keys / W][D][W]
//   O += P V      A = P [rows x keys]                      B = V packed [keys x Dv]
//   dP = dO V^T   A = dO [rows x Dv]                       B = V^T in panels [keys / W][Dv][W]
//   dV += P^T dO  A = P viewed transposed (ars 1, acs ld)  B = dO [rows x Dv]
//   dK += dS^T Q  A = dS viewed transposed                 B = Q [rows x D]
//   dQ += dS K    A = dS [rows x keys]                     B = K packed [keys x D]

#if ATTN_CPU_WIDTH == 16
inline constexpr int kRM = 6, kCM = 4;  // 24 of 32 zmm registers hold C
#else
inline constexpr int kRM = 6, kCM = 2;  // 12 of 16 ymm / xmm registers hold C
#endif

// The operand policy of a micro-tile: what one step of k reads and multiplies.
//   A, B            the element types of A (read one at a time) and of B (read as vectors of W)
//   load_b(p)       the vector of B at p
//   broadcast(a)    an element of A in every lane
//   madd(acc, a, b) acc plus the lane-wise product of a and b
// FmaOperands: f32 operands, one FMA per vector; PairOperands (bf16_dot-inl.h): bf16 pairs, one
// VDPBF16PS per vector.
struct FmaOperands {
  using A = float;
  using B = float;
  static vf load_b(const float* p) { return load(p); }
  static vf broadcast(float a) { return splat(a); }
  static vf madd(vf acc, vf a, vf b) { return acc + a * b; }
};

template <class Op>
using MicroFn = void (*)(int64_t, const typename Op::A*, int64_t, int64_t, const typename Op::B*,
                         int64_t, int64_t, float*, int64_t);

// C[R x C vectors] (=, +=) A[R x K] B[K x C vectors] with the R x C vectors of C in registers.
template <class Op, int R, int C, bool kAccumulate>
void micro_tile(int64_t K, const typename Op::A* A, int64_t ars, int64_t acs,
                const typename Op::B* B, int64_t ldb, int64_t bcs, float* Cm, int64_t ldc) {
  using Bv = decltype(Op::load_b(B));
  vf acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = kAccumulate ? load(Cm + r * ldc + c * W) : vf{};
  }
  for (int64_t k = 0; k < K; ++k) {
    const typename Op::B* b = B + k * ldb;
    const typename Op::A* a = A + k * acs;
    Bv bv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) bv[c] = Op::load_b(b + c * bcs);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const auto av = Op::broadcast(a[r * ars]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = Op::madd(acc[r][c], av, bv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) store(Cm + r * ldc + c * W, acc[r][c]);
  }
}

// The micro-tiles of every size up to kRM x kCM vectors: [(rows - 1) * kCM + (vectors - 1)].
template <class Op, bool kAccumulate, size_t... I>
constexpr std::array<MicroFn<Op>, sizeof...(I)> make_micro_table(std::index_sequence<I...>) {
  return {&micro_tile<Op, static_cast<int>(I / kCM) + 1, static_cast<int>(I % kCM) + 1,
                      kAccumulate>...};
}

// Per row block limits of a product, for tiles that a causal or windowed rule cuts diagonally: row
// block [m0, m0 + kRM) computes only the first n_end[m0 / kRM] columns of C (a multiple of W; the
// rest of its rows is left as it was) and reduces over only the first k_end[m0 / kRM] steps.
// nullptr: all N columns, all K steps.
struct Band {
  const int64_t* n_end = nullptr;
  const int64_t* k_end = nullptr;
};

// C[M x N] (=, +=) A[M x K] B[K x N] over micro-tiles of up to kRM x kCM vectors of Op (strides as
// in gemm); gemm and gemm_pairs (bf16_dot-inl.h) are its two operand types.
template <class Op, bool kAccumulate>
void gemm_blocked(int64_t M, int64_t N, int64_t K, const typename Op::A* A, int64_t ars,
                  int64_t acs, const typename Op::B* B, int64_t ldb, int64_t bcs, float* Cm,
                  int64_t ldc, const Band& band) {
  static constexpr std::array<MicroFn<Op>, kRM* kCM> table =
      make_micro_table<Op, kAccumulate>(std::make_index_sequence<kRM * kCM>{});
  // Column panels outermost: a K x (kCM * W) panel of B stays in L1 while every row block uses it.
  for (int64_t n0 = 0; n0 < N; n0 += kCM * W) {
    for (int64_t m0 = 0; m0 < M; m0 += kRM) {
      const int64_t n_end = band.n_end != nullptr ? band.n_end[m0 / kRM] : N;
      if (n0 >= n_end) continue;
      const int64_t cv = std::min<int64_t>(kCM, (n_end - n0) / W);
      const int64_t k = band.k_end != nullptr ? band.k_end[m0 / kRM] : K;
      const int64_t rr = std::min<int64_t>(kRM, M - m0);
      table[(rr - 1) * kCM + (cv - 1)](k, A + m0 * ars, ars, acs, B + (n0 / W) * bcs, ldb, bcs,
                                       Cm + m0 * ldc + n0, ldc);
    }
  }
}

template <bool kAccumulate>
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B,
          int64_t ldb, int64_t bcs, float* Cm, int64_t ldc, const Band& band = {}) {
  gemm_blocked<FmaOperands, kAccumulate>(M, N, K, A, ars, acs, B, ldb, bcs, Cm, ldc, band);
}

// C += A * B skipping the zero entries of A: used when B (packed V or K) holds an inf or NaN,
// because a masked or dropped weight is 0 and 0 * NaN must not reach C (a removed key never touches
// the output).
inline void gemm_skip_zeros(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars,
                            int64_t acs, const float* B, int64_t ldb, float* Cm, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    float* c = Cm + m * ldc;
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[m * ars + k * acs];
      if (a == 0.0f) continue;
      const float* b = B + k * ldb;
      for (int64_t n = 0; n < N; n += W) store(c + n, load(c + n) + a * load(b + n));
    }
  }
}

// Lane l of the result is lane I_l of the concatenation (a, b): a[i] for I_l = i < W, b[i] for
// I_l = W + i. The pattern is a compile-time constant (one two-source permute on AVX-512).
template <int... I>
inline vf shuffle2(vf a, vf b) {
#if defined(__clang__)  // no __builtin_shuffle in clang: the same lanes as constants
  return __builtin_shufflevector(a, b, I...);
#else
  return __builtin_shuffle(a, b, vi{I...});
#endif
}

// The log2(W) stages of a butterfly over W vectors, distance W / 2 first: Stage::run<S>(x, lanes)
// for S = W / 2, ..., 2, 1 (lanes: 0, ..., W - 1): transpose_block's stages.
template <class Stage>
inline void butterfly(vf* x) {
  constexpr auto lanes = std::make_integer_sequence<int, W>{};
  if constexpr (W >= 16) Stage::template run<8>(x, lanes);
  if constexpr (W >= 8) Stage::template run<4>(x, lanes);
  Stage::template run<2>(x, lanes);
  Stage::template run<1>(x, lanes);
}

// Transposes a W x W block held as W row vectors (r[i][l] -> r[l][i]) in log2(W) stages; at the
// stage of distance S the off-diagonal S x S blocks swap: with i' = i | S (bit S of i clear),
//   r[i][l]  = l & S ? r[i'][l ^ S] : r[i][l],     r[i'][l] = l & S ? r[i'][l] : r[i][l ^ S].
struct TransposeStage {
  template <int S, int... L>
  static void run(vf* r, std::integer_sequence<int, L...>) {
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) {
      if (i & S) continue;
      const vf a = r[i], b = r[i | S];
      r[i] = shuffle2<((L & S) ? W + (L ^ S) : L)...>(a, b);
      r[i | S] = shuffle2<((L & S) ? W + L : (L ^ S))...>(a, b);
    }
  }
};

inline void transpose_block(vf r[W]) {
  butterfly<TransposeStage>(r);
}

// Writes W rows of 32-bit words (src[l], l < rows; rows >= W are zero) as one column panel:
// panel[c * W + l] = src[l][c] for c < cols. Full W x W blocks go through a register transpose (a
// scalar scatter with a stride of a whole tile row thrashes L1). Words are moved, never computed
// with, so the same code packs f32 values and bf16 pairs.
inline void transpose_to_panel(const uint32_t* const* src, int64_t rows, int64_t cols,
                               uint32_t* panel) {
  int64_t c = 0;
  if (rows == W) {
    for (; c + W <= cols; c += W) {
      vf r[W];
#pragma GCC unroll 16
      for (int l = 0; l < W; ++l) r[l] = load(reinterpret_cast<const float*>(src[l] + c));
      transpose_block(r);
#pragma GCC unroll 16
      for (int t = 0; t < W; ++t) store(reinterpret_cast<float*>(panel + (c + t) * W), r[t]);
    }
  }
  for (; c < cols; ++c) {
    for (int64_t l = 0; l < W; ++l) panel[c * W + l] = l < rows ? src[l][c] : 0u;
  }
}
