// The row loop of attn's bf16 Linear product on AMX tiles (tile_linear.h), included inside
// namespace attn::cpu::<isa> after amx_tiles-inl.h by the amx targets only. One call computes rows
// [m0, m1) of y = x w^T: blocks of 32 x 32 results (2 x 2 C tiles; each A and B tile feeds two
// TDPBF16PS), each summing its K chunks in order on the tiles, stored to an L1 block, then the bias
// added and the result written to y (f32, or rounded to bf16). Each result is the same chain of f32
// operations whatever the blocking, the row range or the thread, so the output does not depend on
// the thread count.
//
// Order of the blocks: panels of column blocks whose packed weights fit L2 (kWeightsInL2), all of
// them when they fit; in a panel the row blocks go outermost, so a row block's A stays in L1 across
// the panel's column blocks while the panel's B comes from L2. Measured on an AMX Xeon (1 thread,
// 4096-row products of BERT's shapes, before the panels): weights over 1 MB streamed from L3 per
// row block ran at 0.64-0.84 TFLOP/s against 1.5-1.85 when they fit.
//
// Each block's results go from the tiles to an L1 buffer, and from there, with the bias, to y; the
// rows of one block are written a few at a time between the next block's tile products (a
// BlockWriter), so the vector work overlaps the tiles'. Written after each block instead, they cost
// ~30% of a product with K = 384 (the tile stores drain before the loads can start).
#if defined(ATTN_CPU_AMX)

namespace tile_linear_detail {

inline constexpr int64_t kBlock = 2 * kTileRows;           // 32 rows or columns of y
inline constexpr int64_t kChunkElems = 2 * kTilePairs;     // 32 bf16 of K per tile product
inline constexpr int64_t kWeightsInL2 = int64_t{1} << 20;  // packed bytes kept in L2

// Per-thread buffers: a zero-padded copy of a row block of x (the last rows of the product), the
// zero-padded tail chunk of a row block (K % 32 != 0), and the f32 results of one block.
struct LinearStaging {
  std::vector<uint16_t, AlignedAlloc<uint16_t>> rows;  // [32][K2p * 2]
  alignas(64) uint16_t tail[kBlock * kChunkElems];     // [32][32]
  alignas(64) float c[2][kBlock * kBlock];  // [32][32] results of a block; one being written out
  int next_c = 0;
};
inline LinearStaging& linear_staging() {
  thread_local LinearStaging s;
  return s;
}

// The A operand of one row block of `rows` rows: where its full K chunks are (base, row stride in
// bytes) and where its tail chunk is (null when K is a multiple of 32).
struct BlockRows {
  const uint16_t* a = nullptr;
  int64_t stride = 0;
  int64_t chunks_in_place = 0;  // K chunks read from a; the one after it (if any) from tail
  const uint16_t* tail = nullptr;
};

inline BlockRows stage_rows(const TileLinearRows& p, int64_t m0, int64_t rows, int64_t block_rows,
                            LinearStaging& st) {
  const int64_t K = p.K, full = K / kChunkElems, chunks = (K + kChunkElems - 1) / kChunkElems;
  if (K == 0) return {};  // no K chunks: the tiles stay zero
  const uint16_t* x = p.x + m0 * K;
  if (rows < block_rows) {
    // Rows past the product's last row: a zero-padded copy (a tile reads 16 rows).
    const int64_t Kp = chunks * kChunkElems;
    st.rows.assign(static_cast<size_t>(block_rows * Kp), uint16_t{0});
    for (int64_t r = 0; r < rows; ++r) std::memcpy(st.rows.data() + r * Kp, x + r * K, K * 2);
    return {st.rows.data(), Kp * 2, chunks, nullptr};
  }
  if (full == chunks) return {x, K * 2, full, nullptr};
  // The last K % 32 values of each row, zero-padded to one chunk (an odd K leaves half a pair).
  const int64_t k0 = full * kChunkElems;
  std::fill(st.tail, st.tail + block_rows * kChunkElems, uint16_t{0});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(st.tail + r * kChunkElems, x + r * K + k0, (K - k0) * 2);
  return {x, K * 2, full, st.tail};
}

// One RB x CB block of tiles (RB, CB in {1, 2}) into c ([32][32] f32): C tiles 0-3 (2 r + c), A
// tiles 4-5, B tiles 6-7; b: the first column block's pair-rows (16 words each), the second one bcs
// words on. Loads interleaved with the products that use them; between K chunks, a few rows of the
// previous block go out (writer.step()), the rest before this block's results are stored.
template <int RB, int CB, class Writer>
void linear_block(const BlockRows& a, int64_t chunks, const uint32_t* b, int64_t bcs, float* c,
                  Writer& writer) {
  tile_zero<0>();
  if constexpr (CB == 2) tile_zero<1>();
  if constexpr (RB == 2) tile_zero<2>();
  if constexpr (RB == 2 && CB == 2) tile_zero<3>();
  for (int64_t k = 0; k < chunks; ++k) {
    const bool in_place = k < a.chunks_in_place;
    const uint16_t* ak = in_place ? a.a + k * kChunkElems : a.tail;
    const int64_t as = in_place ? a.stride : kChunkElems * 2;
    const uint32_t* bk = b + k * kTilePairs * W;
    tile_load<4>(ak, as);
    tile_load<6>(bk, kTileBytes);
    tile_dp_bf16<0, 4, 6>();
    if constexpr (CB == 2) {
      tile_load<7>(bk + bcs, kTileBytes);
      tile_dp_bf16<1, 4, 7>();
    }
    if constexpr (RB == 2) {
      tile_load<5>(ak + kTileRows * (as / 2), as);
      tile_dp_bf16<2, 5, 6>();
      if constexpr (CB == 2) tile_dp_bf16<3, 5, 7>();
    }
    writer.step();
  }
  writer.finish();
  const int64_t ldc = kBlock * 4;
  tile_store<0>(c, ldc);
  if constexpr (CB == 2) tile_store<1>(c + W, ldc);
  if constexpr (RB == 2) tile_store<2>(c + kTileRows * kBlock, ldc);
  if constexpr (RB == 2 && CB == 2) tile_store<3>(c + kTileRows * kBlock + W, ldc);
}

// Two vectors of 16 results as 32 bf16 (round_to_bf16's bits): VCVTNE2PS2BF16 where no lane is a
// denormal (the instruction flushes those; the tiles' own results never are, a bias can make one).
inline void store_bf16_pair(uint16_t* y, vf lo, vf hi) {
#if !defined(ATTN_CPU_SOFT_BF16)
  // A denormal's magnitude, less one, is below 0x7fffff as an integer; zero's wraps around.
  const __m512i mag_lo = _mm512_and_epi32((__m512i)lo, _mm512_set1_epi32(0x7fffffff));
  const __m512i mag_hi = _mm512_and_epi32((__m512i)hi, _mm512_set1_epi32(0x7fffffff));
  const __m512i one = _mm512_set1_epi32(1), top = _mm512_set1_epi32(0x7ffffe);
  if ((_mm512_cmple_epu32_mask(_mm512_sub_epi32(mag_lo, one), top) |
       _mm512_cmple_epu32_mask(_mm512_sub_epi32(mag_hi, one), top)) == 0) {
    _mm512_storeu_si512(y, (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo));
    return;
  }
#endif
  const vh a = round_to_bf16(lo), b = round_to_bf16(hi);
  std::memcpy(y, &a, sizeof a);
  std::memcpy(y + W, &b, sizeof b);
}

// A block of results in an L1 buffer (c, [rows][32], cols valid) waiting to be written to y with
// the bias: rows [0, next) are out. Its rows go out a few at a time between the next block's tile
// products, so the vector work runs beside the tiles' (measured: written after the block, the
// tile stores drain first and the tile unit idles).
struct PendingBlock {
  float* c = nullptr;
  int64_t m0 = 0, rows = 0, n0 = 0, cols = 0, next = 0;
};

template <bool kBias, bool kBf16, bool kRowFn>
class BlockWriter {
 public:
  explicit BlockWriter(const TileLinearRows& p, int64_t chunks)
      : p_(p),
        per_step_(std::max<int64_t>(1, (kBlock + chunks - 1) / std::max<int64_t>(1, chunks))) {}
  void hand_over(const PendingBlock& b) { pending_ = b; }
  void step() {
    if (pending_.next < pending_.rows)
      rows_until(std::min(pending_.rows, pending_.next + per_step_));
  }
  void finish() { rows_until(pending_.rows); }

 private:
  void rows_until(int64_t r1) {
    const PendingBlock& b = pending_;
    const float* bias = kBias ? p_.bias + b.n0 : nullptr;
    for (int64_t r = b.next; r < r1; ++r) {
      float* cr = b.c + r * kBlock;
      const int64_t at = (b.m0 + r) * p_.N + b.n0;
      if constexpr (kRowFn) {
        p_.row_fn(p_.row_ctx, cr, b.n0, p_.y16 + at, b.cols);
        continue;
      }
      if (b.cols == kBlock) {
        vf lo = load(cr), hi = load(cr + W);
        if constexpr (kBias) lo += load(bias), hi += load(bias + W);
        if constexpr (kBf16) {
          store_bf16_pair(p_.y16 + at, lo, hi);
        } else {
          store(p_.y32 + at, lo), store(p_.y32 + at + W, hi);
        }
        continue;
      }
      for (int64_t j = 0; j < b.cols; ++j) {
        const float v = kBias ? cr[j] + bias[j] : cr[j];
        if constexpr (kBf16) {
          p_.y16[at + j] = round_to_bf16(vf{} + v)[0];
        } else {
          p_.y32[at + j] = v;
        }
      }
    }
    pending_.next = std::max(pending_.next, r1);
  }

  const TileLinearRows& p_;
  int64_t per_step_;
  PendingBlock pending_;
};

template <class Writer>
void run_block(const TileLinearRows& p, const BlockRows& a, int64_t m0, int64_t rows, int64_t n0,
               LinearStaging& st, Writer& writer) {
  const int64_t cols = std::min(kBlock, p.N - n0), chunks = (p.K + kChunkElems - 1) / kChunkElems;
  const uint32_t* b = p.packed + (n0 / W) * p.bcs;
  float* c = st.c[st.next_c];
  st.next_c ^= 1;
  const bool two_rows = rows > kTileRows, two_cols = cols > W;
  if (two_rows && two_cols) {
    linear_block<2, 2>(a, chunks, b, p.bcs, c, writer);
  } else if (two_rows) {
    linear_block<2, 1>(a, chunks, b, p.bcs, c, writer);
  } else if (two_cols) {
    linear_block<1, 2>(a, chunks, b, p.bcs, c, writer);
  } else {
    linear_block<1, 1>(a, chunks, b, p.bcs, c, writer);
  }
  writer.hand_over({c, m0, rows, n0, cols, 0});
}

template <bool kBias, bool kBf16, bool kRowFn = false>
void rows_with(const TileLinearRows& p) {
  const TileScope scope;
  LinearStaging& st = linear_staging();
  BlockWriter<kBias, kBf16, kRowFn> writer(p, (p.K + kChunkElems - 1) / kChunkElems);
  const int64_t col_blocks = (p.N + kBlock - 1) / kBlock;
  auto block_rows = [&](int64_t m) {
    const int64_t rows = std::min(kBlock, p.m1 - m);
    return std::pair{rows, rows > kTileRows ? kBlock : kTileRows};
  };
  // Panels of column blocks whose packed weights stay in L2 (all of them when they fit), and in a
  // panel the row blocks outermost: a row block's A stays in L1 across the panel's column blocks.
  const int64_t panel =
      p.bcs > 0 ? std::max<int64_t>(1, kWeightsInL2 / (2 * p.bcs * 4)) : col_blocks;  // K = 0: bias
  for (int64_t nb0 = 0; nb0 < col_blocks; nb0 += panel) {
    const int64_t nb1 = std::min(col_blocks, nb0 + panel);
    for (int64_t m = p.m0; m < p.m1; m += kBlock) {
      const auto [rows, padded] = block_rows(m);
      const BlockRows a = stage_rows(p, m, rows, padded, st);
      for (int64_t nb = nb0; nb < nb1; ++nb) run_block(p, a, m, rows, nb * kBlock, st, writer);
    }
  }
  writer.finish();
}

}  // namespace tile_linear_detail

void tile_linear_pack(const uint16_t* w, int64_t N, int64_t K, int64_t K2p, int64_t nb,
                      uint32_t* out) {
  const int64_t n0 = nb * W, cols = std::min<int64_t>(W, N - n0), K2 = (K + 1) / 2;
  if (K % 2 == 0 && K2 % W == 0) {
    // Rows of w are rows of K2 pair words (K even): the block is their W x W transposes.
    transpose_words(reinterpret_cast<const uint32_t*>(w + n0 * K), K2, cols, K2, out, W);
    std::memset(out + K2 * W, 0, static_cast<size_t>((K2p - K2) * W) * 4);
    return;
  }
  std::memset(out, 0, static_cast<size_t>(K2p * W) * 4);
  for (int64_t j = 0; j < cols; ++j) {
    const uint16_t* row = w + (n0 + j) * K;
    for (int64_t k = 0; 2 * k + 1 < K; ++k) {
      out[k * W + j] = static_cast<uint32_t>(row[2 * k]) | static_cast<uint32_t>(row[2 * k + 1])
                                                               << 16;
    }
    if (K % 2 != 0) out[(K / 2) * W + j] = row[K - 1];
  }
}

void tile_linear_rows(const TileLinearRows& p) {
  using namespace tile_linear_detail;
  if (p.m1 <= p.m0 || p.N <= 0) return;
  if (p.row_fn != nullptr) return rows_with<false, true, true>(p);
  if (p.bias != nullptr)
    return p.y16 != nullptr ? rows_with<true, true>(p) : rows_with<true, false>(p);
  return p.y16 != nullptr ? rows_with<false, true>(p) : rows_with<false, false>(p);
}

#endif
