// AMX-BF16 tile products of the cpu backend (included inside namespace attn::cpu::<isa> after
// microkernels-inl.h; only the amx and amx_emulated targets define ATTN_CPU_AMX). Two layers:
//
// 1. The tile layer: configure / release, load / store / zero of the 8 tile registers, and the
//    TDPBF16PS dot product, as the hardware instructions (amx target) or as a software emulation
//    with the same semantics (amx_emulated target, ATTN_CPU_AMX_EMULATED), so that everything above
//    it -- the tiling, the packing, the edge handling of the attention kernels -- runs in the tests
//    on any machine with AVX512_BF16, and the hardware target is tested where the CPU has AMX.
// 2. gemm_tiles: C[M x N] (=, +=) A[M x K2 pairs] B[K2 pairs x N] over those tiles, the products of
//    gemm_pairs (bf16_dot-inl.h) whose A is row-major pairs (S = Q K^T, O += P V, dP = dO V^T,
//    dQ += dS K, and dV += P^T dO, dK += dS^T Q once the backward has transposed P^T and dS^T). The layouts are those of the VDPBF16PS path: A rows of pairs are a tile's rows
//    (16 rows x 16 pairs = 64 bytes), and W = 16 columns of pair-rows of B (K^T panels of pairs,
//    pair-interleaved V or K) are the pair-interleaved B tile the instruction wants, loaded with the
//    stride of B's rows. Nothing is repacked for the tiles.
//
// TDPBF16PS C, A, B (Intel SDM, palette 1): for each row m of C and column n,
//   even = FMA chain over k of A[m].bf16[2k]   * B[k].bf16[2n]     (from 0, k in order)
//   odd  = FMA chain over k of A[m].bf16[2k+1] * B[k].bf16[2n+1]
//   C[m][n] = C[m][n] + (even + odd)
// every FMA and addition in f32, rounded to nearest even, with bf16 denormal inputs read as zero
// and f32 denormal results flushed to zero, whatever MXCSR says.
// The emulation follows that text operation by operation; tests/cpu/amx_tiles_test.cc compares it
// with the hardware bit for bit where the CPU has AMX.

// dst[j * ldd + t] = src[t * lds + j] for t < rows, j < cols (a multiple of W), and 0 for rows <= t <
// round_up(rows, W) (ldd >= that): a matrix of 32-bit words transposed in W x W register blocks.
// It makes the row-pair-interleaved P^T and dS^T of the backward ([row pair][key]) the row-major A
// operand that tiles take ([key][row pair]).
inline void transpose_words(const uint32_t* src, int64_t lds, int64_t rows, int64_t cols,
                            uint32_t* dst, int64_t ldd) {
  for (int64_t t0 = 0; t0 < rows; t0 += W) {
    for (int64_t j0 = 0; j0 < cols; j0 += W) {
      vf r[W];
      for (int l = 0; l < W; ++l) {
        r[l] =
            t0 + l < rows ? load(reinterpret_cast<const float*>(src + (t0 + l) * lds + j0)) : vf{};
      }
      transpose_block(r);
      for (int l = 0; l < W; ++l) store(reinterpret_cast<float*>(dst + (j0 + l) * ldd + t0), r[l]);
    }
  }
}

#if defined(ATTN_CPU_AMX)

inline constexpr bool kAmx = true;
inline constexpr int kTileRows = 16, kTileBytes = 64, kTilePairs = kTileBytes / 4;
static_assert(W == 16, "AMX tiles take 16 columns of f32 (one AVX-512 vector)");

// The 64-byte operand of LDTILECFG (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved0[14] = {};
  uint16_t colsb[8] = {};  // bytes per row of each tile
  uint8_t reserved1[16] = {};
  uint8_t rows[8] = {};
  uint8_t reserved2[8] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Every tile 16 rows x 64 bytes: C tiles 16 x 16 f32, A tiles 16 rows x 16 pairs, B tiles 16
// pair-rows x 16 columns.
inline TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = kTileRows, c.colsb[t] = kTileBytes;
  return c;
}

#if defined(ATTN_CPU_AMX_EMULATED)

inline constexpr bool kAmxEmulated = true;

struct EmulatedTiles {
  TileConfig config;
  bool configured = false;
  alignas(64) uint8_t reg[8][kTileRows][kTileBytes] = {};
};
inline EmulatedTiles& emulated_tiles() {
  thread_local EmulatedTiles t;
  return t;
}

// Where the hardware raises #UD or #GP (a tile instruction without a configuration, shapes that do
// not fit), the emulation stops the process: a kernel that does this is wrong on real tiles too.
[[noreturn]] inline void tile_fault(const char* what) {
  std::fprintf(stderr, "attn: AMX tile fault (emulation): %s\n", what);
  std::abort();
}

inline EmulatedTiles& configured_tiles() {
  EmulatedTiles& t = emulated_tiles();
  if (!t.configured) tile_fault("tile instruction without a tile configuration");
  return t;
}

inline void tile_configure(const TileConfig& c) {
  if (c.palette != 1) tile_fault("palette other than 1");
  for (int t = 0; t < 8; ++t) {
    if (c.rows[t] > kTileRows || c.colsb[t] > kTileBytes) tile_fault("tile larger than 16 x 64");
  }
  EmulatedTiles& t = emulated_tiles();
  t.config = c;
  t.configured = true;
  std::memset(t.reg, 0, sizeof(t.reg));
}
inline void tile_release() {
  EmulatedTiles& t = emulated_tiles();
  t.configured = false;
  std::memset(t.reg, 0, sizeof(t.reg));
}
template <int T>
inline void tile_zero() {
  std::memset(configured_tiles().reg[T], 0, sizeof(EmulatedTiles::reg[T]));
}
// Rows beyond the configured rows and bytes beyond the configured colsb read as zero.
template <int T>
inline void tile_load(const void* base, int64_t stride) {
  EmulatedTiles& t = configured_tiles();
  const int rows = t.config.rows[T], colsb = t.config.colsb[T];
  std::memset(t.reg[T], 0, sizeof(t.reg[T]));
  for (int r = 0; r < rows; ++r) {
    std::memcpy(t.reg[T][r], static_cast<const char*>(base) + r * stride, colsb);
  }
}
template <int T>
inline void tile_store(void* base, int64_t stride) {
  EmulatedTiles& t = configured_tiles();
  const int rows = t.config.rows[T], colsb = t.config.colsb[T];
  for (int r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(base) + r * stride, t.reg[T][r], colsb);
  }
}

// bf16 -> f32 with denormals read as zero.
inline float bf16_daz(uint16_t h) {
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
// A denormal f32 result flushed to a zero of its sign, as the tile unit does.
inline float ftz(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}
// One f32 addition, one f32 FMA (a * b + c, one rounding: std::fma, never left to contraction), as
// the tile unit does them: round to nearest even (the default mode, which the kernels never change),
// denormal results flushed.
inline float add_ftz(float a, float b) {
  return ftz(a + b);
}
inline float fma_ftz(float a, float b, float c) {
  return ftz(std::fma(a, b, c));
}

template <int C, int A, int B>
inline void tile_dp_bf16() {
  static_assert(C != A && C != B && A != B, "TDPBF16PS takes three different tiles");
  EmulatedTiles& t = configured_tiles();
  const TileConfig& cfg = t.config;
  const int M = cfg.rows[C], N = cfg.colsb[C] / 4, K = cfg.colsb[A] / 4;
  if (cfg.rows[A] != M || cfg.rows[B] != K || cfg.colsb[B] != cfg.colsb[C]) {
    tile_fault("TDPBF16PS shapes do not match (rows of A != rows of C, colsb of A != 4 rows of B)");
  }
  for (int m = 0; m < M; ++m) {
    const auto* a = reinterpret_cast<const uint16_t*>(t.reg[A][m]);
    float* c = reinterpret_cast<float*>(t.reg[C][m]);
    for (int n = 0; n < N; ++n) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < K; ++k) {
        const auto* b = reinterpret_cast<const uint16_t*>(t.reg[B][k]);
        even = fma_ftz(bf16_daz(a[2 * k]), bf16_daz(b[2 * n]), even);
        odd = fma_ftz(bf16_daz(a[2 * k + 1]), bf16_daz(b[2 * n + 1]), odd);
      }
      c[n] = add_ftz(c[n], add_ftz(even, odd));
    }
    std::memset(t.reg[C][m] + 4 * N, 0, kTileBytes - 4 * N);
  }
  for (int m = M; m < kTileRows; ++m) std::memset(t.reg[C][m], 0, kTileBytes);
}

#else  // the hardware instructions

inline constexpr bool kAmxEmulated = false;

// GCC's _tile_* macros paste their tile argument into the instruction text, so a template
// parameter cannot be passed to them; these write the same instructions with the tile number as an
// immediate operand (%c: the bare number). Loads and stores clobber memory: the compiler must not
// keep the operands in registers across them.
inline void tile_configure(const TileConfig& c) {
  _tile_loadconfig(&c);
}
inline void tile_release() {
  _tile_release();
}
template <int T>
inline void tile_zero() {
  __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
}
template <int T>
inline void tile_load(const void* base, int64_t stride) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void tile_store(void* base, int64_t stride) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
}
template <int C, int A, int B>
inline void tile_dp_bf16() {
  static_assert(C != A && C != B && A != B, "TDPBF16PS takes three different tiles");
  __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
}

#endif

// Holds the tile configuration of this thread for its lifetime: the outermost scope loads it and
// releases the tiles at its end (the tile state is large; a thread that keeps it dirty slows every
// context switch), nested scopes do nothing. A task of the forward or backward opens one around all
// of its products; gemm_tiles opens its own for callers that did not. Foreign code (another
// library's AMX kernels) cannot run inside a task, so the configuration stays ours in between.
class TileScope {
 public:
  explicit TileScope(bool active = true) : active_(active) {
    if (active_ && depth()++ == 0) tile_configure(full_tiles());
  }
  ~TileScope() {
    if (active_ && --depth() == 0) tile_release();
  }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  bool active_;
};

// Zero-padded copies of the edges of the operands: tiles always read 16 rows of 64 bytes, so a row
// block of A with fewer than 16 rows, the last K chunk when K2 is not a multiple of 16, and a C
// block with fewer than 16 rows go through these (garbage beyond an operand's edge could be NaN,
// and 0 * NaN is NaN).
struct TileStaging {
  std::vector<uint32_t, AlignedAlloc<uint32_t>> a;  // [32 rows x K2p] pairs
  std::vector<uint32_t, AlignedAlloc<uint32_t>> b;  // [N / 16][16 pair-rows][16] of the last chunk
  alignas(64) float c[kTileRows * W];               // one C tile
};
// Slot 0: gemm_tiles; 1 and 2: the forward's pipelined jobs (S and P V under way at once).
inline TileStaging& tile_staging(int slot = 0) {
  thread_local TileStaging s[3];
  return s[slot];
}

// The A operand of one block of `rows` <= block_rows (16 or 32) rows: in place when the block is full
// and K2 is a multiple of 16, else a zero-padded copy in the staging buffer. *lda: its row stride in
// words.
inline const uint32_t* stage_a(const uint32_t* A, int64_t ars, int64_t rows, int64_t block_rows,
                               int64_t K2, TileStaging& st, int64_t* lda) {
  if (rows == block_rows && K2 % kTilePairs == 0) {
    *lda = ars;
    return A;
  }
  const int64_t K2p = round_up(K2, kTilePairs);
  st.a.assign(static_cast<size_t>(block_rows * K2p), 0u);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(st.a.data() + r * K2p, A + r * ars, K2 * 4);
  *lda = K2p;
  return st.a.data();
}

// The last K chunk of B when K2 is not a multiple of 16: its K2 % 16 pair-rows of every 16-column
// block, zero-padded to 16 rows, at st.b + (n / 16) * 256.
inline void stage_b_tail(const uint32_t* B, int64_t ldb, int64_t bcs, int64_t N, int64_t K2,
                         TileStaging& st) {
  const int64_t k0 = K2 / kTilePairs * kTilePairs, kr = K2 - k0, blocks = N / W;
  st.b.assign(static_cast<size_t>(blocks * kTileRows * W), 0u);
  for (int64_t nb = 0; nb < blocks; ++nb) {
    for (int64_t k = 0; k < kr; ++k) {
      std::memcpy(st.b.data() + (nb * kTileRows + k) * W, B + nb * bcs + (k0 + k) * ldb, W * 4);
    }
  }
}

// C tile T <-> rows [0, rows) of a 16 x 16 block of C (through the staging tile when rows < 16).
template <int T>
inline void load_c(const float* c, int64_t ldc, int64_t rows, TileStaging& st) {
  if (rows == kTileRows) return tile_load<T>(c, ldc * 4);
  std::fill(st.c, st.c + kTileRows * W, 0.0f);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(st.c + r * W, c + r * ldc, W * 4);
  tile_load<T>(st.c, W * 4);
}
template <int T>
inline void store_c(float* c, int64_t ldc, int64_t rows, TileStaging& st) {
  if (rows == kTileRows) return tile_store<T>(c, ldc * 4);
  tile_store<T>(st.c, W * 4);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * ldc, st.c + r * W, W * 4);
}

// One block of C of RB x CB tiles (RB, CB in {1, 2}): C tiles 0-3 (tile 2 * r + c), A tiles 4-5,
// B tiles 6-7. a: the block's A rows (stride lda words, K2p pairs readable); b: its first column
// block, the next one bcs words on; bt: the staged tail of B for the first column block, or null.
template <int RB, int CB, bool kAccumulate>
void tile_block(int64_t K2, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                int64_t bcs, const uint32_t* bt, float* c, int64_t ldc, int64_t rows,
                TileStaging& st) {
  const int64_t rows1 = std::min<int64_t>(kTileRows, rows), rows2 = rows - rows1;
  if constexpr (kAccumulate) {
    load_c<0>(c, ldc, rows1, st);
    if constexpr (CB == 2) load_c<1>(c + W, ldc, rows1, st);
    if constexpr (RB == 2) load_c<2>(c + kTileRows * ldc, ldc, rows2, st);
    if constexpr (RB == 2 && CB == 2) load_c<3>(c + kTileRows * ldc + W, ldc, rows2, st);
  } else {
    tile_zero<0>();
    if constexpr (CB == 2) tile_zero<1>();
    if constexpr (RB == 2) tile_zero<2>();
    if constexpr (RB == 2 && CB == 2) tile_zero<3>();
  }
  const int64_t full = K2 / kTilePairs * kTilePairs;
  for (int64_t k0 = 0; k0 < round_up(K2, kTilePairs); k0 += kTilePairs) {
    tile_load<4>(a + k0, lda * 4);
    if constexpr (RB == 2) tile_load<5>(a + kTileRows * lda + k0, lda * 4);
    if (k0 < full) {
      tile_load<6>(b + k0 * ldb, ldb * 4);
      if constexpr (CB == 2) tile_load<7>(b + bcs + k0 * ldb, ldb * 4);
    } else {
      tile_load<6>(bt, W * 4);
      if constexpr (CB == 2) tile_load<7>(bt + kTileRows * W, W * 4);
    }
    tile_dp_bf16<0, 4, 6>();
    if constexpr (CB == 2) tile_dp_bf16<1, 4, 7>();
    if constexpr (RB == 2) tile_dp_bf16<2, 5, 6>();
    if constexpr (RB == 2 && CB == 2) tile_dp_bf16<3, 5, 7>();
  }
  store_c<0>(c, ldc, rows1, st);
  if constexpr (CB == 2) store_c<1>(c + W, ldc, rows1, st);
  if constexpr (RB == 2) store_c<2>(c + kTileRows * ldc, ldc, rows2, st);
  if constexpr (RB == 2 && CB == 2) store_c<3>(c + kTileRows * ldc + W, ldc, rows2, st);
}

// C[M x N] (=, +=) A[M x K2 pairs] B[K2 pairs x N], N a multiple of 16; A row-major pairs (row
// stride ars words), B as in gemm_pairs (column vector c of pair-row k at B + c * bcs + k * ldb),
// as a sequence of blocks of C of 32 x 32 (2 x 2 tiles: each A and B tile feeds two products), row
// block by row block. Every element of C sums its K chunks in order, whatever block it falls in,
// so the result does not depend on the blocking. run() computes all of it; step() one block, so
// that a caller can run other work between blocks (the forward's softmax, between the blocks of the
// next rows' S and the last rows' P V): the tile unit then works on a block while the vector units
// run the instructions that follow it. The job uses its own staging buffers (two jobs may be under
// way at once) and must stay inside one TileScope from the first step to the last. Jobs over the
// same B (the forward's row blocks of one key tile) stage its K tail once: b_tail_staged says the
// staging buffers hold it already.
template <bool kAccumulate>
class TileJob {
 public:
  static constexpr int64_t kBlock = 2 * kTileRows;

  TileJob() = default;
  TileJob(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t ars, const uint32_t* B,
          int64_t ldb, int64_t bcs, float* Cm, int64_t ldc, TileStaging& st,
          bool b_tail_staged = false)
      : M_(M),
        N_(N),
        K2_(K2),
        A_(A),
        ars_(ars),
        B_(B),
        ldb_(ldb),
        bcs_(bcs),
        C_(Cm),
        ldc_(ldc),
        st_(&st) {
    col_blocks_ = (N + kBlock - 1) / kBlock;
    blocks_ = M > 0 ? (M + kBlock - 1) / kBlock * col_blocks_ : 0;
    if (blocks_ > 0 && K2 % kTilePairs != 0 && !b_tail_staged) stage_b_tail(B, ldb, bcs, N, K2, st);
  }

  int64_t blocks_left() const { return blocks_ - next_; }

  // Computes the next block of C; false when none was left.
  bool step() {
    if (next_ >= blocks_) return false;
    const int64_t m0 = next_ / col_blocks_ * kBlock, n0 = next_ % col_blocks_ * kBlock;
    ++next_;
    const int64_t rows = std::min(kBlock, M_ - m0);
    const bool two_rows = rows > kTileRows, two_cols = n0 + W < N_;
    if (n0 == 0)
      a_ = stage_a(A_ + m0 * ars_, ars_, rows, two_rows ? kBlock : kTileRows, K2_, *st_, &lda_);
    const uint32_t* b = B_ + (n0 / W) * bcs_;
    const uint32_t* bt = K2_ % kTilePairs != 0 ? st_->b.data() + (n0 / W) * kTileRows * W : nullptr;
    float* c = C_ + m0 * ldc_ + n0;
    if (two_rows && two_cols) {
      tile_block<2, 2, kAccumulate>(K2_, a_, lda_, b, ldb_, bcs_, bt, c, ldc_, rows, *st_);
    } else if (two_rows) {
      tile_block<2, 1, kAccumulate>(K2_, a_, lda_, b, ldb_, bcs_, bt, c, ldc_, rows, *st_);
    } else if (two_cols) {
      tile_block<1, 2, kAccumulate>(K2_, a_, lda_, b, ldb_, bcs_, bt, c, ldc_, rows, *st_);
    } else {
      tile_block<1, 1, kAccumulate>(K2_, a_, lda_, b, ldb_, bcs_, bt, c, ldc_, rows, *st_);
    }
    return true;
  }

  void run() {
    while (step()) {
    }
  }

 private:
  int64_t M_ = 0, N_ = 0, K2_ = 0;
  const uint32_t* A_ = nullptr;
  int64_t ars_ = 0;
  const uint32_t* B_ = nullptr;
  int64_t ldb_ = 0, bcs_ = 0;
  float* C_ = nullptr;
  int64_t ldc_ = 0;
  TileStaging* st_ = nullptr;
  int64_t col_blocks_ = 0, blocks_ = 0, next_ = 0;
  const uint32_t* a_ = nullptr;  // the current row block's A (staged or in place)
  int64_t lda_ = 0;
};

template <bool kAccumulate>
void gemm_tiles(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t ars, const uint32_t* B,
                int64_t ldb, int64_t bcs, float* Cm, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const TileScope scope;
  TileJob<kAccumulate>(M, N, K2, A, ars, B, ldb, bcs, Cm, ldc, tile_staging()).run();
}

#else

inline constexpr bool kAmx = false;
struct TileScope {
  explicit TileScope(bool = true) {}
};

#endif
