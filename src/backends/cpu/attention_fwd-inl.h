// The flash-style forward of the cpu backend (included inside namespace attn::cpu::<isa>).
//
//   q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv], lse [B, Hq, Lq]
//
// One task = (b, h, a tile of BQ query rows[, a chunk of keys]). Per key tile of BK keys: K^T and V
// are packed (converted to f32, zero-padded to W lanes), S = scale (Q K^T) by register-blocked
// micro-tiles, every row is scored and goes through the online softmax (fp32 running max m and sum
// l), O = alpha O + P V. O is normalised once at the end: out = O / l (times 1 / (1 - p) under
// dropout), lse = m + log l. Nothing of size Lq x Lk exists unless the weights are asked for (then
// a second pass writes exp(s - lse)).
//
// Split-KV: when a problem has too few row tiles to keep the cores busy (decode, one small head)
// the keys of each row tile are cut into chunks whose (O, m, l) are merged in chunk order. The cut
// depends on the shape only, never on the thread count, so the result is bitwise the same for any
// number of threads.

inline constexpr int64_t kMaxGroup = 4;  // query tiles per forward task, at most

struct FwdPlan {
  int64_t BQ = 0, BK = 0, Dvp = 0;
  int64_t BKp = 0;  // row stride of S (floats) and of P (BKp / 2 words): >= BK, a multiple of W
  int64_t n_qt = 0, n_kt = 0;
  int64_t chunk = 0, n_chunks = 1;  // keys per split-KV chunk (a multiple of BK)
  // Query tiles per task: they share each packed key tile (attend). n_tasks = B * Hq * n_groups.
  int64_t group = 1, n_groups = 0;
  int64_t total = 0;  // scratch floats per worker
  // The scratch buffers of a worker (floats unless said).
  struct Buffers {
    Slot q;          // the task's query rows, scaled [GQ x D]
    Slot kt, v;      // the key tile: K^T in column panels [D][BKp], V packed [BK x Dvp]
    Slot s, pv;      // S then P [BQ x BKp]; P V of the tile [BQ x Dvp]
    Slot o, m, l;    // the running output [GQ x Dvp], max and sum [GQ]
    Slot alpha;      // per row rescale of the tile [BQ]
    Slot bias, row;  // a row's bias [BKp]; W converted rows (pack_panels)
    Slot p;          // P as bf16 pairs (bf16_dot-inl.h) [BQ x BKp / 2]
  } buf;
};

// bf16 q, k and v on a target with VDPBF16PS: both products of the forward run on bf16 pairs
// (bf16_dot-inl.h), on AMX tiles where the target has them.
inline bool forward_on_pairs(const contract::ForwardProblem& p) {
  return kBf16Dot && p.q.dtype() == DType::bf16 && p.k.dtype() == DType::bf16 &&
         p.v.dtype() == DType::bf16 && p.D > 0;
}

inline FwdPlan plan_forward(const contract::ForwardProblem& p) {
  FwdPlan plan;
  const TileSizes t = tile_sizes(p.D, p.Dv, /*backward=*/false, forward_on_pairs(p), kAmx);
  plan.BQ = std::max<int64_t>(1, std::min<int64_t>(t.bq, p.Lq));
  plan.BK = std::max<int64_t>(W, std::min<int64_t>(t.bk, round_up(std::max<int64_t>(p.Lk, 1), W)));
  // On AMX tiles, S rows a multiple of 1 KB apart put the 16 rows of a tile store into a few L1
  // sets: the stores of S at D 64, BK 512 took 6.3 TSC cycles per 16 scores on an AMX Xeon against
  // 4.6 with the rows 1 KB + 128 bytes apart (a standalone program, 2026-12-06); in the forward,
  // 1-5% at D 64, none at D 128 (and f32 on the micro-kernels ~1% slower: not padded). 2W floats,
  // so that P's rows (BKp / 2 words) stay on 64-byte lines: a tile row across two lines loads
  // slower.
  plan.BKp = round_up(plan.BK, W);
  if (kAmx && forward_on_pairs(p) && plan.BKp % 256 == 0) plan.BKp += 2 * W;
  plan.Dvp = round_up(p.Dv, W);
  plan.n_qt = (p.Lq + plan.BQ - 1) / plan.BQ;
  plan.n_kt = (p.Lk + plan.BK - 1) / plan.BK;
  const int64_t row_tasks = p.B * p.Hq * plan.n_qt;
  plan.chunk = std::max<int64_t>(1, plan.n_kt) * plan.BK;
  if (row_tasks < kSplitMinTasks && plan.n_kt >= 2) {
    const int64_t want = std::min<int64_t>(plan.n_kt, (kSplitMinTasks + row_tasks - 1) / row_tasks);
    plan.chunk = (plan.n_kt + want - 1) / want * plan.BK;
  }
  plan.n_chunks = std::max<int64_t>(1, (p.Lk + plan.chunk - 1) / plan.chunk);
  // Up to kMaxGroup query tiles per task while there are >= 4 tasks per thread (dynamic
  // scheduling then balances causal rows); split-KV keeps one tile per task. A row's arithmetic
  // does not depend on the grouping, so neither do the results (any thread count, bitwise).
  if (plan.n_chunks == 1) {
    const int64_t threads = resolve_threads(p.threads);
    plan.group = kMaxGroup;
    while (plan.group > 1 &&
           p.B * p.Hq * ((plan.n_qt + plan.group - 1) / plan.group) < 4 * threads) {
      plan.group /= 2;
    }
  }
  plan.n_groups = (plan.n_qt + plan.group - 1) / plan.group;
  ScratchLayout layout;
  auto take = [&](int64_t n) { return layout.take(n); };
  const int64_t GQ = plan.group * plan.BQ;  // rows of one task
  plan.buf.q = take(GQ * std::max<int64_t>(p.D, 1));
  plan.buf.kt = take(std::max<int64_t>(p.D, 1) * plan.BKp);
  plan.buf.v = take(plan.BK * plan.Dvp);
  plan.buf.s = take(plan.BQ * plan.BKp);
  plan.buf.o = take(GQ * plan.Dvp);
  plan.buf.pv = take(plan.BQ * plan.Dvp);
  plan.buf.m = take(GQ);
  plan.buf.l = take(GQ);
  plan.buf.alpha = take(plan.BQ);
  plan.buf.bias = take(plan.BKp);
  plan.buf.row = take(W * std::max(p.D, p.Dv) + W);  // W converted rows (pack_panels)
  if (kBf16Dot) plan.buf.p = take(plan.BQ * plan.BKp / 2);
  plan.total = layout.total;
  return plan;
}

// Packs rows [r0, r0 + n) of (b, h) of x ([B, H, L, cols]: keys of K or V) as column panels, the B
// operand layout of S = Q K^T and dP = dO V^T: dst[(j / W) * (cols * W) + c * W + j % W] = x[r0 +
// j][c], zero for n <= j < round_up(n, W). tmp holds W converted rows [W x cols] for 16-bit inputs.
inline void pack_panels(const View4& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t cols,
                        float* dst, float* tmp) {
  const int64_t np = round_up(n, W);
  for (int64_t jb = 0; jb < np; jb += W) {
    const int64_t rows = std::min<int64_t>(W, n - jb);
    const uint32_t* src[W];
    for (int64_t l = 0; l < rows; ++l) {
      const char* row = x.row(b, h, r0 + jb + l);
      if (x.dtype == DType::f32) {
        src[l] = reinterpret_cast<const uint32_t*>(row);
      } else {
        load_row(row, x.dtype, cols, tmp + l * cols);
        src[l] = reinterpret_cast<const uint32_t*>(tmp + l * cols);
      }
    }
    transpose_to_panel(src, rows, cols, reinterpret_cast<uint32_t*>(dst + jb * cols));
  }
}

inline void pack_rows(const View4& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t cols,
                      int64_t ld, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    float* d = dst + r * ld;
    load_row(x.row(b, h, r0 + r), x.dtype, cols, d);
    std::fill(d + cols, d + ld, 0.0f);
  }
}

// The per-call constants of the forward.
struct Fwd {
  const contract::ForwardProblem& p;
  FwdPlan plan;
  View4 q, k, v, out, lse, weights;
  float scale = 1.0f, keep_scale = 1.0f;
  // bf16 q, k and v on a target with VDPBF16PS: both products run on bf16 pairs (bf16_dot-inl.h);
  // the query and K^T scratch then hold pairs instead of floats.
  bool pairs = false;
  // bf16 pairs on AMX tiles with the tile products of each query sub-tile pipelined against its
  // softmax (tile_pipeline, amx_pipeline-inl.h); off: the products run whole between the passes.
  bool pipelined = false;
  // (m, l) of every row [B, Hq, Lq, 2] when the weights are asked for: exp(s - m) / l is more
  // accurate than exp(s - lse) (lse = m + log l carries the rounding of log l, ~2e-7 for Lk ~ 300).
  float* row_ml = nullptr;

  explicit Fwd(const contract::ForwardProblem& prob) : p(prob), plan(plan_forward(prob)) {
    q = View4::of(p.q), k = View4::of(p.k), v = View4::of(p.v), out = View4::of(p.out);
    weights = View4::of(p.weights);
    lse = View4::of(p.lse.unsqueeze(-1));
    scale = static_cast<float>(p.scale);
    keep_scale = p.dropout.active() ? static_cast<float>(p.dropout.keep_scale()) : 1.0f;
    pairs = forward_on_pairs(p);
    pipelined = kAmx && pairs && amx_pipeline();
  }

  // Loads the query rows [i0, i0 + nr) of (b, h): qs [nr x D]. The scale is applied to the scores
  // (one rounding per score instead of one per query element).
  void load_queries(int64_t b, int64_t h, int64_t i0, int64_t nr, float* qs) const {
#if defined(ATTN_CPU_BF16_DOT)
    if (pairs) {
      const int64_t d2 = (p.D + 1) / 2;
      auto* qp = reinterpret_cast<uint32_t*>(qs);
      for (int64_t r = 0; r < nr; ++r) load_pairs(q.row(b, h, i0 + r), p.D, qp + r * d2);
      return;
    }
#endif
    for (int64_t r = 0; r < nr; ++r) load_row(q.row(b, h, i0 + r), q.dtype, p.D, qs + r * p.D);
  }

  // kt = keys [j0, j0 + nk) of kv head hk as K^T panels (pairs or floats: key_products' B);
  // tmp is the row scratch of pack_panels.
  void pack_keys(int64_t b, int64_t hk, int64_t j0, int64_t nk, float* kt, float* tmp) const {
#if defined(ATTN_CPU_BF16_DOT)
    if (pairs) {
      pack_pair_panels(k, b, hk, j0, nk, p.D, reinterpret_cast<uint32_t*>(kt),
                       reinterpret_cast<uint32_t*>(tmp));
      return;
    }
#endif
    pack_panels(k, b, hk, j0, nk, p.D, kt, tmp);
  }

  // The query rows [i0, ...) of (b, h) read where they are, as key_products' A, when they already
  // are its operand: f32 rows (the micro-tiles broadcast A element by element, at any row stride),
  // or bf16 pairs (whole pairs, rows on 4-byte boundaries); then *qa is row i0 and *ld its row
  // stride in words (> 0: key_products reads 0 as "the scratch's stride"; broadcast rows are
  // copied). The copies of load_queries took ~5% of a call at L 128 (AMX Xeon, bf16); at L 128, D
  // 32 on a Zen 4 (a memcpy of 64-128 bytes per row) f32 runs 1-3% faster without them, bf16 on
  // VDPBF16PS 5-7%; neutral at L >= 512. False: load_queries copies them.
  bool queries_in_place(int64_t b, int64_t h, int64_t i0, const float** qa, int64_t* ld) const {
    if (q.s2 <= 0) return false;
    if (!pairs && q.dtype == DType::f32 && (q.s3 == 1 || p.D <= 1)) {
      *qa = reinterpret_cast<const float*>(q.row(b, h, i0));
      *ld = q.s2;
      return true;
    }
    if (!pairs || p.D % 2 != 0 || q.s3 != 1 || q.s2 % 2 != 0) return false;
    const char* row = q.row(b, h, i0);
    if (reinterpret_cast<uintptr_t>(row) % 4 != 0) return false;
    *qa = reinterpret_cast<const float*>(row);
    *ld = q.s2 / 2;
    return true;
  }

  // s [nr x BKp] = Q K^T (unscaled) over the first nkp columns of the panels kt, for nr query rows
  // at qs as load_queries left them (row stride query_stride()) or in place (row stride q_ld).
  void key_products(int64_t nr, int64_t nkp, const float* qs, const float* kt, float* s,
                    const Band& band = {}, int64_t q_ld = 0) const {
    const int64_t D = p.D;
#if defined(ATTN_CPU_BF16_DOT)
    if (pairs) {
      const int64_t d2 = (D + 1) / 2;
      pair_products(nr, nkp, d2, reinterpret_cast<const uint32_t*>(qs), q_ld > 0 ? q_ld : d2,
                    reinterpret_cast<const uint32_t*>(kt), W, d2 * W, s, plan.BKp,
                    {band.n_end, nullptr});
      return;
    }
#endif
    gemm<false>(nr, nkp, D, qs, q_ld > 0 ? q_ld : D, 1, kt, W, D * W, s, plan.BKp,
                {band.n_end, nullptr});
  }

#if defined(ATTN_CPU_BF16_DOT)
  // C [M x N] = A B on bf16 pairs (gemm_pairs' operands, A row-major). A band cuts the products
  // of a diagonal tile: on the VDPBF16PS micro-kernels per block of kRM rows; on AMX tiles per
  // block of 32 rows (TileJob's), each up to the columns (n_end) or the reduction (k_end) of its
  // last row, the band's ends being per row there (band_rows()). Above a block's ends nothing is
  // computed: the softmax reads no column of S past its row's end, and P is 0 in the reduction a
  // block skips, whose terms would only have added +0 to its sums (their bits stay the same).
  void pair_products(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t ars,
                     const uint32_t* B, int64_t ldb, int64_t bcs, float* C, int64_t ldc,
                     const Band& band) const {
#if defined(ATTN_CPU_AMX)
    if (band.n_end == nullptr && band.k_end == nullptr) {
      gemm_tiles<false>(M, N, K2, A, ars, B, ldb, bcs, C, ldc);  // the same blocks, one job
      return;
    }
    constexpr int64_t R = TileJob<false>::kBlock;
    for (int64_t r0 = 0; r0 < M; r0 += R) {
      const int64_t rows = std::min(R, M - r0), last = r0 + rows - 1;
      const int64_t n = band.n_end != nullptr ? band.n_end[last] : N;
      const int64_t k2 = band.k_end != nullptr ? band.k_end[last] : K2;
      gemm_tiles<false>(rows, n, k2, A + r0 * ars, ars, B, ldb, bcs, C + r0 * ldc, ldc);
    }
#else
    gemm_pairs<false>(M, N, K2, A, ars, 1, B, ldb, bcs, C, ldc, band);
#endif
  }
#endif

  // 32-bit words per query row in the qs scratch (floats, or bf16 pairs).
  int64_t query_stride() const {
    return pairs ? (p.D + 1) / 2 : p.D;
  }

  // Rows per entry of the band: a block of the micro-kernels, or single rows where the products
  // run on AMX tiles: pair_products cuts those per block of 32 rows (the micro-kernels' blocks
  // kept diagonal tiles on VDPBF16PS, at half the f32 rate on Xeons: causal bf16 ran slower than
  // non-causal), and each row's softmax stops at its own end.
  int64_t band_rows() const {
    return kAmx && pairs ? 1 : kRM;
  }

  // The keys of a tile that a causal or windowed rule cuts diagonally (TileInfo::positional), per
  // block of band_rows() rows: block [m0, m0 + band_rows()) needs keys below hi of its last row only.
  // ends [3 x blocks]: columns of S (a multiple of W, >= W), keys, and key pairs; the band of S
  // limits columns, those of P V the reduction. Above the diagonal nothing is computed.
  void diagonal_band(const RowScorer& rs, int64_t i0, int64_t nr, int64_t j0, int64_t nk,
                     std::vector<int64_t>& ends, Band* s_band, Band* pv_band,
                     Band* pv_pair_band) const {
    const int64_t rows_per_block = band_rows();
    const int64_t blocks = (nr + rows_per_block - 1) / rows_per_block, nkp = round_up(nk, W);
    ends.resize(static_cast<size_t>(3 * blocks));
    for (int64_t blk = 0; blk < blocks; ++blk) {
      int64_t lo, hi;
      p.rule.key_range(i0 + std::min(nr, (blk + 1) * rows_per_block) - 1, rs.key_length, &lo, &hi);
      const int64_t cols = std::clamp<int64_t>(round_up(hi - j0, W), W, nkp);
      ends[blk] = cols;
      ends[blocks + blk] = std::min(nk, cols);
      ends[2 * blocks + blk] = (std::min(nk, cols) + 1) / 2;
    }
    *s_band = {ends.data(), nullptr};
    *pv_band = {nullptr, ends.data() + blocks};
    *pv_pair_band = {nullptr, ends.data() + 2 * blocks};
  }

  // Whether P leaves the softmax as bf16 pairs (pairs without dropout: one pass over the row fewer)
  // instead of f32 in s, rounded after dropout.
  bool p_from_softmax() const {
    return pairs && !p.dropout.active();
  }

  // One tile of a query sub-tile: rows i0 + [0, nr) of (b, h) against keys j0 + [0, nk).
  struct TileRows {
    int64_t b, h, i0, nr, j0, nk;
  };

  // Row r of a tile made final (finish_row) and its max, ahead of its online softmax.
  struct ScoredRow {
    float factor = 1.0f, max_score = 0.0f;
    int64_t nkp = 0, nk = 0;  // keys [0, nkp) count (nk of them real); the rest becomes P = 0
  };
  ScoredRow score_row(const RowScorer& rs, const TileInfo& t, const TileRows& tr,
                      const Band& s_band, int64_t r, float* sr, float* bias) const {
    ScoredRow sc;
    sc.nkp = s_band.n_end != nullptr ? s_band.n_end[r / band_rows()] : round_up(tr.nk, W);
    sc.nk = std::min(tr.nk, sc.nkp);
    sc.factor = rs.finish_row(t, tr.i0 + r, tr.j0, sc.nk, sr, nullptr, bias);
    sc.max_score = row_max_score(sr, sc.nkp, sc.factor);
    return sc;
  }

  // The online softmax of row r of a tile over its scores sr, scored: alpha[r] and the row's m, l
  // updated; P as bf16 halves in p_pairs (p_from_softmax()) or as f32 in sr (dropped entries
  // zeroed), 0 past the row's band.
  void softmax_row(const TileRows& tr, const ScoredRow& sc, int64_t r, float* sr,
                   [[maybe_unused]] uint32_t* p_pairs, float* m, float* l, float* alpha) const {
    const int64_t nkp = round_up(tr.nk, W);
#if defined(ATTN_CPU_BF16_DOT)
    if (p_from_softmax()) {
      auto* halves = reinterpret_cast<uint16_t*>(p_pairs + r * (plan.BKp / 2));
      alpha[r] =
          online_softmax_row(sr, sc.nkp, sc.factor, sc.max_score, m + r, l + r, PAsBf16{halves});
      std::fill(halves + sc.nkp, halves + nkp, uint16_t{0});
      return;
    }
#endif
    alpha[r] = online_softmax_row(sr, sc.nkp, sc.factor, sc.max_score, m + r, l + r, PInPlace{sr});
    if (p.dropout.active()) drop_row(p.dropout, tr.b, tr.h, tr.i0 + r, tr.j0, sc.nk, sr);
    std::fill(sr + sc.nkp, sr + nkp, 0.0f);
  }

  // softmax_row over rows [r0, r1) of a tile (scores at s + r * BKp). Each row is scored before
  // the previous one's exp pass, so that its max (a chain of reductions, which the row's exp pass
  // waits on) is worked out beside that pass instead of between two of them.
  void softmax_rows(const RowScorer& rs, const TileInfo& t, const TileRows& tr, const Band& s_band,
                    int64_t r0, int64_t r1, float* s, uint32_t* p_pairs, float* m, float* l,
                    float* alpha, float* bias) const {
    const int64_t BKp = plan.BKp;
    if (r0 >= r1) return;
    ScoredRow next = score_row(rs, t, tr, s_band, r0, s + r0 * BKp, bias);
    for (int64_t r = r0; r < r1; ++r) {
      const ScoredRow sc = next;
      if (r + 1 < r1) next = score_row(rs, t, tr, s_band, r + 1, s + (r + 1) * BKp, bias);
      softmax_row(tr, sc, r, s + r * BKp, p_pairs, m, l, alpha);
    }
  }

#if defined(ATTN_CPU_BF16_DOT)
  // P V of a tile on bf16 pairs (P from the softmax, or rounded here after dropout; V packed by
  // pack_value_pairs), merged into the sub-tile's O (first: its first tile). inf and NaN values
  // were packed as 0 (a zero weight must skip them, not multiply them): their terms come after.
  void values_on_pairs(const TileRows& tr, const Band& pv_pair_band, const uint32_t* v_pairs,
                       bool nonfinite_values, float* o, bool first, Scratch& w) const {
    const int64_t BKp = plan.BKp, Dvp = plan.Dvp, nkp = round_up(tr.nk, W);
    float* s = plan.buf.s.in(w);
    float* pv = first ? o : plan.buf.pv.in(w);  // the first tile's P V is O (merge_tile's copy)
    auto* p_pairs = reinterpret_cast<uint32_t*>(plan.buf.p.in(w));
    if (!p_from_softmax()) {
      for (int64_t r = 0; r < tr.nr; ++r) round_to_pairs(s + r * BKp, nkp, p_pairs + r * (BKp / 2));
    }
    pair_products(tr.nr, Dvp, (tr.nk + 1) / 2, p_pairs, BKp / 2, v_pairs, Dvp, W, pv, Dvp,
                  pv_pair_band);
    if (nonfinite_values) {
      add_nonfinite_values(v, tr.b, tr.h / p.group, tr.j0, tr.nk, p.Dv, p_pairs, BKp / 2, tr.nr, pv,
                           Dvp);
    }
    if (!first) merge_tile(tr.nr, plan.buf.alpha.in(w), pv, o, false);  // first: P V is in O
  }
#endif

  // The keys [*jb, *je) that the query tile of rows [i0, i1) visits within [kb, ke): lo and hi of
  // the position rule are non-decreasing in i; key tiles start at multiples of BK (or at kb).
  void key_span(int64_t key_length, int64_t i0, int64_t i1, int64_t kb, int64_t ke, int64_t* jb,
                int64_t* je) const {
    int64_t lo_first, hi_first, lo_last, hi_last;
    p.rule.key_range(i0, key_length, &lo_first, &hi_first);
    p.rule.key_range(i1 - 1, key_length, &lo_last, &hi_last);
    *jb = std::max(kb, lo_first / plan.BK * plan.BK);
    *je = std::min(ke, hi_last);
  }

  // What attend does for rows [i0, i1) of batch entry b over all keys, in (row, key) pairs of the
  // tiles it visits: the measure by which forward_impl orders its tasks.
  int64_t work(int64_t b, int64_t i0, int64_t i1) const {
    int64_t total = 0;
    for (int64_t g0 = i0; g0 < i1; g0 += plan.BQ) {
      const int64_t g1 = std::min(i1, g0 + plan.BQ);
      int64_t jb, je;
      key_span(p.key_length_of(b), g0, g1, 0, p.Lk, &jb, &je);
      total += (g1 - g0) * std::max<int64_t>(0, je - jb);
    }
    return total;
  }

  // Runs rows [i0, i1) of (b, h) (at most group * BQ) over keys [kb, ke), in query tiles of BQ
  // rows that share each key tile: K^T and V are packed once per key tile for all of them, not
  // once per query tile (the transposes took 8% of a D = 64 forward). Leaves the unnormalised O
  // [(i1 - i0) x Dvp], m and l of each row in the scratch. Every row's arithmetic is that of a
  // call with one query tile: the same key tiles, cut at the same ends, in the same order.
  void attend(const RowScorer& rs, int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t kb,
              int64_t ke, Scratch& w) const {
    const int64_t rows = i1 - i0, hk = h / p.group;
    const int64_t BQ = plan.BQ, BK = plan.BK, BKp = plan.BKp, Dvp = plan.Dvp;
    const int64_t n_sub = (rows + BQ - 1) / BQ;
    float* qs = plan.buf.q.in(w);
    float* kt = plan.buf.kt.in(w);
    float* vp = plan.buf.v.in(w);
    float* s = plan.buf.s.in(w);
    float* o = plan.buf.o.in(w);
    float* pv = plan.buf.pv.in(w);
    float* m = plan.buf.m.in(w);
    float* l = plan.buf.l.in(w);
    float* alpha = plan.buf.alpha.in(w);
    float* bias = plan.buf.bias.in(w);
    float* tmp = plan.buf.row.in(w);
    const float* qa = qs;  // the query rows as key_products' A, row stride qstride (words)
    int64_t qstride = query_stride();
    if (!queries_in_place(b, h, i0, &qa, &qstride)) load_queries(b, h, i0, rows, qs);
    std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + rows, 0.0f);

    int64_t jb[kMaxGroup], je[kMaxGroup];
    int64_t j_begin = ke, j_end = kb;
    for (int64_t g = 0; g < n_sub; ++g) {
      key_span(rs.key_length, i0 + g * BQ, std::min(i1, i0 + (g + 1) * BQ), kb, ke, &jb[g], &je[g]);
      j_begin = std::min(j_begin, jb[g]);
      j_end = std::max(j_end, je[g]);
    }
    const bool dropout = p.dropout.active();
    bool merged[kMaxGroup] = {};  // whether query sub-tile g has merged a tile into O yet
    for (int64_t j0 = j_begin; j0 < j_end; j0 += BK) {
      const int64_t n_pack = std::min(j0 + BK, j_end) - j0;  // keys packed for every query tile
      bool keys_packed = false, values_packed = false;
      [[maybe_unused]] bool nonfinite_values = false;  // pairs only
      const float* vb = vp;                            // V as the f32 B operand [n_pack x ldv]
      int64_t ldv = Dvp;
      for (int64_t g = 0; g < n_sub; ++g) {
        if (j0 < jb[g] || j0 >= je[g]) continue;
        const int64_t gi0 = i0 + g * BQ, gi1 = std::min(i1, gi0 + BQ), nr = gi1 - gi0;
        const int64_t j1 = std::min(j0 + BK, je[g]);
        const TileInfo t = rs.classify(gi0, gi1, j0, j1);
        if (t.skip) continue;
        const int64_t nk = j1 - j0, nkp = round_up(nk, W);
        float* og = o + g * BQ * Dvp;
        float* mg = m + g * BQ;
        float* lg = l + g * BQ;
        if (!keys_packed) {
          pack_keys(b, hk, j0, n_pack, kt, tmp);
          keys_packed = true;
        }
        Band s_band, pv_band, pv_pair_band;
        if (t.positional) {
          diagonal_band(rs, gi0, nr, j0, nk, w.band, &s_band, &pv_band, &pv_pair_band);
        }
        [[maybe_unused]] auto* p_pairs = reinterpret_cast<uint32_t*>(plan.buf.p.in(w));
        [[maybe_unused]] auto* v_pairs = reinterpret_cast<uint32_t*>(vp);
#if defined(ATTN_CPU_BF16_DOT)
        if (pairs && !values_packed) {
          nonfinite_values = pack_value_pairs(v, b, hk, j0, n_pack, p.Dv, Dvp, v_pairs);
          values_packed = true;
        }
#endif
#if defined(ATTN_CPU_AMX)
        if (pipelined) {
          const TilePipelineRows pr{reinterpret_cast<const uint32_t*>(qa) + g * BQ * qstride,
                                    qstride,
                                    reinterpret_cast<const uint32_t*>(kt),
                                    v_pairs,
                                    nonfinite_values,
                                    og,
                                    mg,
                                    lg,
                                    !merged[g]};
          tile_pipeline(rs, t, {b, h, gi0, nr, j0, nk}, s_band, pr, w);
          merged[g] = true;
          continue;
        }
#endif
        key_products(nr, nkp, qa + g * BQ * qstride, kt, s, s_band, qstride);
        softmax_rows(rs, t, {b, h, gi0, nr, j0, nk}, s_band, 0, nr, s, p_pairs, mg, lg, alpha,
                     bias);
#if defined(ATTN_CPU_BF16_DOT)
        if (pairs) {
          values_on_pairs({b, h, gi0, nr, j0, nk}, pv_pair_band, v_pairs, nonfinite_values, og,
                          !merged[g], w);
          merged[g] = true;
          continue;
        }
#endif
        // V as the B operand: in place when it is f32 with rows of whole vectors, else packed.
        if (!values_packed) {
          if (v.dtype == DType::f32 && p.Dv == Dvp) {
            vb = reinterpret_cast<const float*>(v.row(b, hk, j0));
            ldv = v.s2;
          } else {
            pack_rows(v, b, hk, j0, n_pack, p.Dv, Dvp, vp);
          }
          values_packed = true;
        }
        // Zero weights (removed or dropped keys) meet a non-finite V only on tiles with
        // per-element work.
        bool careful = false;
        if (t.positional || t.biased || dropout) {
          for (int64_t jj = 0; jj < nk && !careful; ++jj) careful = !all_finite(vb + jj * ldv, Dvp);
        }
        // The sub-tile's first tile computes its P V in O itself, the bits merge_tile's copy would
        // put there (f32 L 128 D 128, 1 thread: 1-3% faster in 4 of 5 alternations, Zen 4).
        float* pvg = merged[g] ? pv : og;
        if (careful) {
          std::fill(pvg, pvg + nr * Dvp, 0.0f);
          gemm_skip_zeros(nr, Dvp, nk, s, BKp, 1, vb, ldv, pvg, Dvp);
        } else {
          gemm<false>(nr, Dvp, nk, s, BKp, 1, vb, ldv, W, pvg, Dvp, pv_band);
        }
        if (merged[g]) merge_tile(nr, alpha, pv, og, false);
        merged[g] = true;
      }
    }
  }

#if defined(ATTN_CPU_AMX)
  // What tile_pipeline needs of a query sub-tile besides its TileRows: its query rows and the
  // packed key tile as pairs, V pair-interleaved (and whether inf / NaN values were packed as 0),
  // and its rows' running O, m and l.
  struct TilePipelineRows {
    const uint32_t* qs;
    int64_t q_ld;  // words per row of qs
    const uint32_t* kt;
    const uint32_t* v_pairs;
    bool nonfinite_values;
    float* o;
    float* m;
    float* l;
    bool first_merge;  // the sub-tile's first tile: merge_tile copies into O
  };
  void tile_pipeline(const RowScorer& rs, const TileInfo& t, const TileRows& tr, const Band& s_band,
                     const TilePipelineRows& pr, Scratch& w) const;
#endif

  // O = alpha * O + PV row by row (alpha from online_softmax_row). This tile's P V is summed on
  // its own before it meets O: the keys of a row are added in blocks of BK, so the f32 rounding
  // of O grows with BK + Lk / BK terms instead of Lk (at Lk = 32768 the difference between 2e-6
  // and 2e-7 of the output's magnitude).
  // The first tile a query sub-tile merges (first) copies P V into O, which is not zeroed before:
  // alpha is 0 or 1 there and O would be 0, and P V is never -0 (every sum starts at +0), so the
  // copy gives the bits of 0 * 0 + P V (the zeroing and its reads took ~4% of a call at L 128).
  // attend and values_on_pairs skip even the copy (their first P V is computed in O); the AMX
  // pipeline, whose P V is staged per block of rows, copies.
  void merge_tile(int64_t nr, const float* alpha, const float* pv, float* o, bool first) const {
    const int64_t Dvp = plan.Dvp;
    if (first) {
      std::copy(pv, pv + nr * Dvp, o);
      return;
    }
    for (int64_t r = 0; r < nr; ++r) {
      float* orow = o + r * Dvp;
      const float* prow = pv + r * Dvp;
      if (alpha[r] == 1.0f) {
        for (int64_t c = 0; c < Dvp; c += W) store(orow + c, load(orow + c) + load(prow + c));
      } else {
        const vf a = splat(alpha[r]);
        for (int64_t c = 0; c < Dvp; c += W) store(orow + c, load(orow + c) * a + load(prow + c));
      }
    }
  }

  // out = O / l (times 1 / (1 - p)), lse = m + log l; a row without any allowed key gets 0 and
  // -inf.
  void write_rows(int64_t b, int64_t h, int64_t i0, int64_t nr, const float* o, const float* m,
                  const float* l, float* tmp) const {
    const int64_t Dvp = plan.Dvp;
    // f32 rows of whole vectors are written where they go, not through tmp and a copy (B 32, H 12,
    // L 128, D 32, 1 thread: 1-4% faster in 4 of 5 alternations on a Zen 4).
    const bool in_place = out.dtype == DType::f32 && p.Dv == Dvp;
    for (int64_t r = 0; r < nr; ++r) {
      float* lse_at = reinterpret_cast<float*>(lse.row(b, h, i0 + r));
      if (row_ml != nullptr) {
        float* ml = row_ml + ((b * p.Hq + h) * p.Lq + i0 + r) * 2;
        ml[0] = m[r], ml[1] = l[r];
      }
      float* dst = in_place ? reinterpret_cast<float*>(out.row(b, h, i0 + r)) : tmp;
      if (l[r] != 0.0f) {  // l is NaN for a NaN row (NaN in q or an allowed k): it propagates
        const vf inv = splat(keep_scale / l[r]);
        for (int64_t c = 0; c < Dvp; c += W) store(dst + c, load(o + r * Dvp + c) * inv);
        *lse_at = m[r] + std::log(l[r]);
      } else {
        std::fill(dst, dst + Dvp, 0.0f);
        *lse_at = -std::numeric_limits<float>::infinity();
      }
      if (!in_place) store_row(tmp, p.Dv, out.dtype, out.row(b, h, i0 + r));
    }
  }

  // weights[b, h, i, :] = exp(s - m) / l for rows [i0, i1) (0 for removed keys and rows without
  // keys), with the (m, l) that write_rows kept.
  void write_weights(const RowScorer& rs, int64_t b, int64_t h, int64_t i0, int64_t i1,
                     Scratch& w) const {
    const int64_t nr = i1 - i0, hk = h / p.group, BK = plan.BK, BKp = plan.BKp;
    float* qs = plan.buf.q.in(w);
    float* kt = plan.buf.kt.in(w);
    float* s = plan.buf.s.in(w);
    float* bias = plan.buf.bias.in(w);
    float* tmp = plan.buf.row.in(w);
    load_queries(b, h, i0, nr, qs);
    for (int64_t j0 = 0; j0 < p.Lk; j0 += BK) {
      const int64_t j1 = std::min(j0 + BK, p.Lk), nk = j1 - j0, nkp = round_up(nk, W);
      const TileInfo t = rs.classify(i0, i1, j0, j1);
      if (t.skip) {
        std::fill(s, s + nkp, 0.0f);
        for (int64_t r = 0; r < nr; ++r) {
          store_row(s, nk, weights.dtype, weights.row(b, h, i0 + r) + j0 * weights.item);
        }
        continue;
      }
      pack_keys(b, hk, j0, nk, kt, tmp);
      key_products(nr, round_up(nk, W), qs, kt, s);
      for (int64_t r = 0; r < nr; ++r) {
        float* sr = s + r * BKp;
        const vf factor = splat(rs.finish_row(t, i0 + r, j0, nk, sr, nullptr, bias));
        const float* ml = row_ml + ((b * p.Hq + h) * p.Lq + i0 + r) * 2;
        if (ml[1] == 0.0f) {
          std::fill(sr, sr + nkp, 0.0f);
        } else {
          // A removed key gets 0 by selection, also in a row whose m is NaN.
          const vf mv = splat(ml[0]), lv = splat(ml[1]), removed = removed_product(factor);
          for (int64_t j = 0; j < nkp; j += W) {
            const vf sv = load(sr + j);
            store(sr + j, sv == removed ? vf{} : vexp(sv * factor - mv) / lv);
          }
        }
        store_row(sr, nk, weights.dtype, weights.row(b, h, i0 + r) + j0 * weights.item);
      }
    }
  }
};
