// The forward's bf16 tile products pipelined against its softmax on AMX (included inside namespace
// attn::cpu::<isa> after attention_fwd-inl.h; only the amx targets define ATTN_CPU_AMX).
//
// With the products on tiles, the softmax on the vector units is the larger part of a bf16 forward
// (a profile on a Xeon: the softmax 49% of the time, the tile products 31%), and run one after the
// other neither unit works while the other does. The tile unit runs a TDPBF16PS while the core goes
// on issuing the instructions that follow it, as far as its reorder window reaches, so the two
// overlap when the instruction stream interleaves them finely: a few vector rows of softmax, one
// block of C (32 x 32, a handful of TDPBF16PS), a few rows, the next block.
//
// A query sub-tile's rows go in blocks of 32: while the softmax runs over block r, the tile unit
// computes S = Q K^T of block r + 1 and P V of block r - 1, one block of C after every few rows.
// Block r's P V needs its whole softmax (P and alpha), block r + 1's softmax its S: S of block 0
// runs alone first and P V of the last block alone at the end. Each product is cut into the same
// blocks of C, each element summing its K chunks in the same order, as the unpipelined path
// (gemm_tiles): the results are the same bits.
//
// Measured on a Xeon with AMX (family 6 model 167, 2026-12-06; `attn bench --amx-pipeline on,off`,
// bf16 rows alternated call by call): from 6% slower to 4% faster than the unpipelined path, about
// 1% slower in the middle, so it is off by default. Microbenchmarks on that core say why the
// overlap is small: TDPBF16PS takes 16 cycles, a tile load 8 and a tile store 16, and the stores
// wait on the products; a block of 8 products beside 128 independent vector FMAs took 327 cycles
// (time x 3.8 GHz) against 268 for the FMAs alone and 128 for the products alone, so the two units
// overlap only partly. The S tiles of D = 64 (two K chunks per 32 x 32 block, then four 1 KB
// stores) are bound by the tile stores, not the products.

#if defined(ATTN_CPU_AMX)

inline void Fwd::tile_pipeline(const RowScorer& rs, const TileInfo& t, const TileRows& tr,
                               const Band& s_band, const TilePipelineRows& pr, Scratch& w) const {
  constexpr int64_t R = TileJob<false>::kBlock;  // rows per block
  const int64_t nr = tr.nr, BKp = plan.BKp, Dvp = plan.Dvp, nkp = round_up(tr.nk, W);
  const int64_t d2 = (p.D + 1) / 2, k2 = (tr.nk + 1) / 2, blocks = (nr + R - 1) / R;
  float* s = plan.buf.s.in(w);
  float* pv = plan.buf.pv.in(w);
  float* alpha = plan.buf.alpha.in(w);
  float* bias = plan.buf.bias.in(w);
  auto* p_pairs = reinterpret_cast<uint32_t*>(plan.buf.p.in(w));
  auto rows_of = [&](int64_t rb) { return std::min(R, nr - rb * R); };
  // Every block's S has the same B (the key tile's K^T panels), every P V the same V: their K
  // tails (when D / 2 or the keys / 2 are not a multiple of 16 pairs) are staged once here.
  TileStaging &s_staging = tile_staging(1), &pv_staging = tile_staging(2);
  if (d2 % kTilePairs != 0) stage_b_tail(pr.kt, W, d2 * W, nkp, d2, s_staging);
  if (k2 % kTilePairs != 0) stage_b_tail(pr.v_pairs, Dvp, W, Dvp, k2, pv_staging);
  auto s_job = [&](int64_t rb) {
    return TileJob<false>(rows_of(rb), nkp, d2, pr.qs + rb * R * pr.q_ld, pr.q_ld, pr.kt, W, d2 * W,
                          s + rb * R * BKp, BKp, s_staging, /*b_tail_staged=*/true);
  };
  auto pv_job = [&](int64_t rb) {
    return TileJob<false>(rows_of(rb), Dvp, k2, p_pairs + rb * R * (BKp / 2), BKp / 2, pr.v_pairs,
                          Dvp, W, pv + rb * R * Dvp, Dvp, pv_staging, /*b_tail_staged=*/true);
  };
  // Block rb's P V done: the terms of inf / NaN values (packed as 0), then O = alpha O + P V.
  auto merge_block = [&](int64_t rb) {
    const int64_t r0 = rb * R, rows = rows_of(rb);
    if (pr.nonfinite_values) {
      add_nonfinite_values(v, tr.b, tr.h / p.group, tr.j0, tr.nk, p.Dv, p_pairs + r0 * (BKp / 2),
                           BKp / 2, rows, pv + r0 * Dvp, Dvp);
    }
    merge_tile(rows, alpha + r0, pv + r0 * Dvp, pr.o + r0 * Dvp, pr.first_merge);
  };

  s_job(0).run();
  for (int64_t rb = 0; rb < blocks; ++rb) {
    TileJob<false> next_s = rb + 1 < blocks ? s_job(rb + 1) : TileJob<false>{};
    TileJob<false> last_pv = rb > 0 ? pv_job(rb - 1) : TileJob<false>{};
    const int64_t r0 = rb * R, rows = rows_of(rb);
    const int64_t steps = next_s.blocks_left() + last_pv.blocks_left();
    int64_t done = 0;
    for (int64_t r = r0; r < r0 + rows; ++r) {
      softmax_rows(rs, t, tr, s_band, r, r + 1, s, p_pairs, pr.m, pr.l, alpha, bias);
      if (!p_from_softmax()) round_to_pairs(s + r * BKp, nkp, p_pairs + r * (BKp / 2));
      // The blocks due after this row, spread evenly over the block's rows.
      for (const int64_t due = steps * (r - r0 + 1) / rows; done < due; ++done) {
        if (!last_pv.step()) next_s.step();
      }
    }
    if (rb > 0) merge_block(rb - 1);
  }
  pv_job(blocks - 1).run();
  merge_block(blocks - 1);
}

#endif
