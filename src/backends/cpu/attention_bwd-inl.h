// The backward of the cpu backend (included inside namespace attn::cpu::<isa>, after the forward).
//
//   dout [B, Hq, Lq, Dv], q, k, v, out, lse
//     ->  dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D], dv [B, Hkv, Lk, Dv]
//
// It walks the forward in reverse, tile by tile, recomputing P from the LSE instead of storing it:
//   forward  S = (scale Q) K^T, s -> softcap/alibi/mask, P = exp(s - lse), O = P V (/ (1 - p) kept)
//   backward Di = rowsum(dO o O); dP = dO V^T (kept / (1 - p), dropped 0); dS = P o (dP - Di);
//            dV += P_dropped^T dO; through the softcap dS *= 1 - tanh^2; dK += scale dS^T Q; dQ +=
//            scale dS K (the scale applied once, when dK and dQ are written).
// One task = (b, kv head, a chunk of key tiles); it owns dK and dV of its keys outright (the query
// heads of a GQA group are summed inside the task, in order). dQ gets contributions from every key
// tile: a task adds them into its own partial buffer, and the partials of a (b, kv head) are summed
// in chunk order afterwards. The chunking depends on the shape only, so dq, dk, dv are bitwise the
// same for any thread count.

inline uint32_t* as_words(float* x) {
  return reinterpret_cast<uint32_t*>(x);
}

struct BwdPlan {
  int64_t BQ = 0, BK = 0, BKp = 0, Dp = 0, Dvp = 0;
  int64_t n_qt = 0, n_kt = 0;
  int64_t chunks = 1, tiles_per_chunk = 1;
  int64_t total = 0, ld_t_rows = 0;  // scratch floats per worker; row stride of p_t_rows, ds_t_rows
  // The scratch buffers of a worker (floats unless said).
  struct Buffers {
    Slot kt, vt;             // K^T, V^T of the key tile in column panels [D or Dv][BKp]
    Slot k_rows;             // K of the key tile as rows [BK x Dp] (the B of dQ += dS K)
    Slot dk, dv;             // the key tile's dK [BK x Dp], dV [BK x Dvp]
    Slot q, dout;            // the query tile's Q [BQ x Dp], dO [BQ x Dvp]
    Slot s, dp, tanh, bias;  // S, dP, tanh of the softcap [BQ x BKp]; a row's bias [BKp]
    Slot row, row2;          // W converted rows (pack_panels); a second row (D_i = dO . O)
    // bf16 pairs (bf16_dot-inl.h): P^T and dS^T interleaved by row pairs, dS by key pairs, Q and
    // dO interleaved by row pairs.
    Slot p_t, ds_t, ds_pairs, q_pairs, dout_pairs;
    // amx targets: P^T and dS^T transposed to [key][row pair] words (row-major A for the tiles).
    Slot p_t_rows, ds_t_rows;
  } buf;
};

// bf16 q, k, v and dout on a target with VDPBF16PS: all five products of the backward run on bf16
// pairs, with P and dS rounded to bf16 as their operands (what a plain bf16 backward does).
inline bool backward_on_pairs(const contract::BackwardProblem& p) {
  return kBf16Dot && p.q.dtype() == DType::bf16 && p.k.dtype() == DType::bf16 &&
         p.v.dtype() == DType::bf16 && p.dout.dtype() == DType::bf16 && p.D > 0 && p.Dv > 0;
}

inline BwdPlan plan_backward(const contract::BackwardProblem& p) {
  BwdPlan plan;
  const TileSizes t = tile_sizes(p.D, p.Dv, /*backward=*/true, backward_on_pairs(p));
  plan.BQ = std::max<int64_t>(1, std::min<int64_t>(t.bq, p.Lq));
  plan.BK = std::max<int64_t>(W, std::min<int64_t>(t.bk, round_up(std::max<int64_t>(p.Lk, 1), W)));
  plan.BKp = round_up(plan.BK, W);
  plan.Dp = round_up(p.D, W);
  plan.Dvp = round_up(p.Dv, W);
  plan.n_qt = (p.Lq + plan.BQ - 1) / plan.BQ;
  plan.n_kt = (p.Lk + plan.BK - 1) / plan.BK;
  const int64_t pairs = p.B * p.Hkv;
  if (pairs < kSplitMinTasks && plan.n_kt >= 2) {
    plan.chunks = std::min<int64_t>(plan.n_kt, (kSplitMinTasks + pairs - 1) / pairs);
    // Keep the dQ partials (chunks per pair, f32) within a bound.
    const int64_t per_chunk = pairs * p.group * p.Lq * plan.Dp * 4;
    while (plan.chunks > 1 && plan.chunks * per_chunk > (int64_t{256} << 20)) --plan.chunks;
  }
  plan.tiles_per_chunk = std::max<int64_t>(1, (plan.n_kt + plan.chunks - 1) / plan.chunks);
  plan.chunks = std::max<int64_t>(1, (plan.n_kt + plan.tiles_per_chunk - 1) / plan.tiles_per_chunk);
  ScratchLayout layout;
  auto take = [&](int64_t n) { return layout.take(n); };
  plan.buf.kt = take(p.D * plan.BKp);
  plan.buf.vt = take(p.Dv * plan.BKp);
  plan.buf.k_rows = take(plan.BK * plan.Dp);
  plan.buf.dk = take(plan.BK * plan.Dp);
  plan.buf.dv = take(plan.BK * plan.Dvp);
  plan.buf.q = take(plan.BQ * plan.Dp);
  plan.buf.dout = take(plan.BQ * plan.Dvp);
  plan.buf.s = take(plan.BQ * plan.BKp);
  plan.buf.dp = take(plan.BQ * plan.BKp);
  plan.buf.tanh = take(p.softcap > 0 ? plan.BQ * plan.BKp : 1);
  plan.buf.bias = take(plan.BKp);
  plan.buf.row = take(W * std::max(plan.Dp, plan.Dvp) + W);  // W converted rows (pack_panels)
  plan.buf.row2 = take(std::max(plan.Dp, plan.Dvp) + W);
  if (backward_on_pairs(p)) {
    const int64_t rows2 = (plan.BQ + 1) / 2;
    plan.buf.p_t = take(rows2 * plan.BKp);
    plan.buf.ds_t = take(rows2 * plan.BKp);
    plan.buf.ds_pairs = take(plan.BQ * plan.BKp / 2);
    plan.buf.q_pairs = take(rows2 * plan.Dp);
    plan.buf.dout_pairs = take(rows2 * plan.Dvp);
    if (kAmx) {
      plan.ld_t_rows = round_up(rows2, W);
      plan.buf.p_t_rows = take(plan.BKp * plan.ld_t_rows);
      plan.buf.ds_t_rows = take(plan.BKp * plan.ld_t_rows);
    }
  }
  plan.total = layout.total;
  return plan;
}

struct Bwd {
  const contract::BackwardProblem& p;
  BwdPlan plan;
  View4 q, k, v, dout, lse, dq, dk, dv, dscores;
  std::vector<float, AlignedAlloc<float>> di;  // [B, Hq, Lq]: dO_i . O_i
  float scale = 1.0f, keep_scale = 1.0f;
  bool pairs = false;  // backward_on_pairs

  explicit Bwd(const contract::BackwardProblem& prob) : p(prob), plan(plan_backward(prob)) {
    pairs = backward_on_pairs(prob);
    q = View4::of(p.q), k = View4::of(p.k), v = View4::of(p.v), dout = View4::of(p.dout);
    lse = View4::of(p.lse.unsqueeze(-1));
    dq = View4::of(p.dq), dk = View4::of(p.dk), dv = View4::of(p.dv),
    dscores = View4::of(p.dscores);
    scale = static_cast<float>(p.scale);
    keep_scale = p.dropout.active() ? static_cast<float>(p.dropout.keep_scale()) : 1.0f;
  }

  void compute_di(Scratch& w, int64_t b, int64_t h) {
    const View4 o = View4::of(p.out);
    float* a = plan.buf.row.in(w);
    float* c = plan.buf.row2.in(w);
    for (int64_t i = 0; i < p.Lq; ++i) {
      load_row(dout.row(b, h, i), dout.dtype, p.Dv, a);
      load_row(o.row(b, h, i), o.dtype, p.Dv, c);
      float acc = 0.0f;
      for (int64_t d = 0; d < p.Dv; ++d) acc += a[d] * c[d];
      di[static_cast<size_t>((b * p.Hq + h) * p.Lq + i)] = acc;
    }
  }

  // The key tile [j0, j0 + nk) of kv head hk, packed once for every query tile of the group: K^T
  // and V^T in column panels (the B operands of S = Q K^T and dP = dO V^T, in scratch kt, vt) and
  // K as rows (the B operand of dQ += dS K: in place when f32 with rows of whole vectors).
  struct KeyTile {
    int64_t j0 = 0, j1 = 0, nk = 0, nkp = 0;
    const float* k_rows = nullptr;
    int64_t ldk = 0;
    bool k_finite = true;  // false: K holds an inf or NaN, whose dQ terms need the careful path
  };

  KeyTile pack_key_tile(int64_t b, int64_t hk, int64_t kt_i, Scratch& w) const {
    KeyTile kt;
    kt.j0 = kt_i * plan.BK, kt.j1 = std::min(p.Lk, kt.j0 + plan.BK), kt.nk = kt.j1 - kt.j0;
    kt.nkp = round_up(kt.nk, W);
    float* k_rows = plan.buf.k_rows.in(w);
    float* tmp = plan.buf.row.in(w);
    kt.k_rows = k_rows, kt.ldk = plan.Dp;
#if defined(ATTN_CPU_BF16_DOT)
    if (pairs) {
      // K^T and V^T in panels of pairs (over D, Dv); K interleaved by key pairs, inf / NaN as 0
      // (their terms of dQ are added apart, as in the forward's P V).
      pack_pair_panels(k, b, hk, kt.j0, kt.nk, p.D, as_words(plan.buf.kt.in(w)), as_words(tmp));
      pack_pair_panels(v, b, hk, kt.j0, kt.nk, p.Dv, as_words(plan.buf.vt.in(w)), as_words(tmp));
      kt.k_finite = !pack_value_pairs(k, b, hk, kt.j0, kt.nk, p.D, plan.Dp, as_words(k_rows));
      return kt;
    }
#endif
    pack_panels(k, b, hk, kt.j0, kt.nk, p.D, plan.buf.kt.in(w), tmp);
    pack_panels(v, b, hk, kt.j0, kt.nk, p.Dv, plan.buf.vt.in(w), tmp);
    if (k.dtype == DType::f32 && p.D == plan.Dp) {
      kt.k_rows = reinterpret_cast<const float*>(k.row(b, hk, kt.j0)), kt.ldk = k.s2;
    } else {
      pack_rows(k, b, hk, kt.j0, kt.nk, p.D, plan.Dp, k_rows);
    }
    for (int64_t jj = 0; jj < kt.nk && kt.k_finite; ++jj)
      kt.k_finite = all_finite(kt.k_rows + jj * kt.ldk, plan.Dp);
    return kt;
  }

  // Query rows [i0, i0 + nr) of head h as the A operands of the scores (Q, dO) and the B operands
  // of dK += dS^T Q, dV += P^T dO: in place when f32 with rows of whole vectors, else packed.
  struct QueryTile {
    int64_t h = 0, i0 = 0, nr = 0;
    const float* q = nullptr;
    const float* dout = nullptr;
    int64_t ldq = 0, lddo = 0;
  };

  // Pass 1 (the forward's products again): S = Q K^T into s and dP = dO V^T into dp, [nr x BKp].
  QueryTile score_tile(int64_t b, int64_t h, int64_t i0, int64_t nr, const KeyTile& kt,
                       Scratch& w) const {
    QueryTile qt{h, i0, nr, plan.buf.q.in(w), plan.buf.dout.in(w), plan.Dp, plan.Dvp};
    float* k_t = plan.buf.kt.in(w);
    float* v_t = plan.buf.vt.in(w);
    float* s = plan.buf.s.in(w);
    float* dp = plan.buf.dp.in(w);
#if defined(ATTN_CPU_BF16_DOT)
    if (pairs) {
      // On rows of pairs.
      const int64_t d2 = (p.D + 1) / 2, dv2 = (p.Dv + 1) / 2;
      uint32_t* q_words = as_words(plan.buf.q.in(w));
      uint32_t* do_words = as_words(plan.buf.dout.in(w));
      for (int64_t r = 0; r < nr; ++r) {
        load_pairs(q.row(b, h, i0 + r), p.D, q_words + r * d2);
        load_pairs(dout.row(b, h, i0 + r), p.Dv, do_words + r * dv2);
      }
      gemm_pairs<false>(nr, kt.nkp, d2, q_words, d2, 1, as_words(k_t), W, d2 * W, s, plan.BKp);
      gemm_pairs<false>(nr, kt.nkp, dv2, do_words, dv2, 1, as_words(v_t), W, dv2 * W, dp, plan.BKp);
      return qt;
    }
#endif
    if (q.dtype == DType::f32 && p.D == plan.Dp) {
      qt.q = reinterpret_cast<const float*>(q.row(b, h, i0)), qt.ldq = q.s2;
    } else {
      pack_rows(q, b, h, i0, nr, p.D, plan.Dp, plan.buf.q.in(w));
    }
    if (dout.dtype == DType::f32 && p.Dv == plan.Dvp) {
      qt.dout = reinterpret_cast<const float*>(dout.row(b, h, i0)), qt.lddo = dout.s2;
    } else {
      pack_rows(dout, b, h, i0, nr, p.Dv, plan.Dvp, plan.buf.dout.in(w));
    }
    gemm<false>(nr, kt.nkp, p.D, qt.q, qt.ldq, 1, k_t, W, p.D * W, s, plan.BKp);
    gemm<false>(nr, kt.nkp, p.Dv, qt.dout, qt.lddo, 1, v_t, W, p.Dv * W, dp, plan.BKp);
    return qt;
  }

  // Pass 2, row by row: P recomputed from the LSE into s (times kept / (1 - p) under dropout) and
  // dS = P o (dP - Di) into dp, through the softcap's 1 - tanh^2; d(scores) written when asked.
  void ds_tile(const RowScorer& rs, const TileInfo& t, int64_t b, const QueryTile& qt,
               const KeyTile& kt, Scratch& w) const {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    const int64_t BKp = plan.BKp, nkp = kt.nkp;
    const bool dropout = p.dropout.active(), softcap = p.softcap > 0;
    float* bias = plan.buf.bias.in(w);
    for (int64_t r = 0; r < qt.nr; ++r) {
      const int64_t i = qt.i0 + r;
      float* sr = plan.buf.s.in(w) + r * BKp;
      float* dpr = plan.buf.dp.in(w) + r * BKp;
      float* thr = plan.buf.tanh.in(w) + r * BKp;
      const vf factor = splat(rs.finish_row(t, i, kt.j0, kt.nk, sr, softcap ? thr : nullptr, bias));
      const float row_lse = *reinterpret_cast<const float*>(lse.row(b, qt.h, i));
      if (row_lse == ninf) {
        // A row without allowed keys has P = 0 and every gradient 0.
        std::fill(sr, sr + nkp, 0.0f);
        std::fill(dpr, dpr + nkp, 0.0f);
      } else {
        // kept / (1 - p) per key under dropout, built in `bias` (finish_row is done with it).
        if (dropout) {
          std::fill(bias, bias + nkp, keep_scale);
          drop_row(p.dropout, b, qt.h, i, kt.j0, kt.nk, bias);
        }
        const vf lv = splat(row_lse),
                 dv_i = splat(di[static_cast<size_t>((b * p.Hq + qt.h) * p.Lq + i)]);
        const vf removed = removed_product(factor);
        for (int64_t j = 0; j < nkp; j += W) {
          // A removed key has P = 0 by selection, whatever the row's LSE: a NaN LSE (a NaN in q)
          // made exp(-inf - NaN) NaN in the dK and dV of keys the row does not use.
          const vf sv = load(sr + j);
          const vf pr = sv == removed ? vf{} : vexp(sv * factor - lv);
          vf dpv = load(dpr + j);
          vf pd = pr;
          if (dropout) {
            const vf kf = load(bias + j);
            dpv = kf == 0.0f ? vf{} : dpv * kf;
            pd = pr * kf;
          }
          // A removed key has P = 0: select, so a NaN in its v cannot leak through dP.
          const vf ds = pr == 0.0f ? vf{} : pr * (dpv - dv_i);
          store(sr + j, pd);
          store(dpr + j, ds);
        }
      }
      if (dscores.base != nullptr) {
        store_row(dpr, kt.nk, DType::f32, dscores.row(b, qt.h, i) + kt.j0 * dscores.item);
      }
      if (softcap) {
        // Select, not multiply: a removed key has dS = 0 but its tanh may be NaN (its k is inf or
        // NaN), and 0 * NaN would carry it into dQ and its own dK.
        for (int64_t j = 0; j < nkp; j += W) {
          const vf tv = load(thr + j), ds = load(dpr + j);
          store(dpr + j, ds == 0.0f ? vf{} : ds * (1.0f - tv * tv));
        }
      }
    }
  }

  // Pass 3: dV += P^T dO, dK += dS^T Q into the key tile's dv, dk rows and dQ += dS K into dqr
  // (both scaled when written).
  void accumulate_grads(const TileInfo& t, int64_t b, int64_t hk, const QueryTile& qt,
                        const KeyTile& kt, float* dqr, Scratch& w) const {
    const int64_t nr = qt.nr, nk = kt.nk, BKp = plan.BKp, Dp = plan.Dp, Dvp = plan.Dvp;
    float* s = plan.buf.s.in(w);
    float* dp = plan.buf.dp.in(w);
    float* dkt = plan.buf.dk.in(w);
    float* dvt = plan.buf.dv.in(w);
#if defined(ATTN_CPU_BF16_DOT)
    if (pairs) {
      accumulate_grads_on_pairs(b, hk, qt, kt, dqr, w);
      return;
    }
#endif
    (void)b, (void)hk;
    gemm<true>(nk, Dvp, nr, s, 1, BKp, qt.dout, qt.lddo, W, dvt, Dvp);
    gemm<true>(nk, Dp, nr, dp, 1, BKp, qt.q, qt.ldq, W, dkt, Dp);
    if (kt.k_finite || !(t.positional || t.biased || p.dropout.active())) {
      gemm<true>(nr, Dp, nk, dp, BKp, 1, kt.k_rows, kt.ldk, W, dqr, Dp);
    } else {
      gemm_skip_zeros(nr, Dp, nk, dp, BKp, 1, kt.k_rows, kt.ldk, dqr, Dp);
    }
  }

#if defined(ATTN_CPU_BF16_DOT)
  // Pass 3 on bf16 pairs: row-pair reductions, P^T and dS^T against Q and dO interleaved by row
  // pairs (as they are: a NaN query row reaches dK as in f32); then dS by key pairs against K.
  void accumulate_grads_on_pairs(int64_t b, int64_t hk, const QueryTile& qt, const KeyTile& kt,
                                 float* dqr, Scratch& w) const {
    const int64_t nr = qt.nr, nk = kt.nk, nkp = kt.nkp, BKp = plan.BKp, Dp = plan.Dp,
                  Dvp = plan.Dvp, nr2 = (nr + 1) / 2;
    float* s = plan.buf.s.in(w);
    float* dp = plan.buf.dp.in(w);
    float* dkt = plan.buf.dk.in(w);
    float* dvt = plan.buf.dv.in(w);
    uint32_t* p_t = as_words(plan.buf.p_t.in(w));
    uint32_t* ds_t = as_words(plan.buf.ds_t.in(w));
    uint32_t* ds_pairs = as_words(plan.buf.ds_pairs.in(w));
    uint32_t* q_pairs = as_words(plan.buf.q_pairs.in(w));
    uint32_t* do_pairs = as_words(plan.buf.dout_pairs.in(w));
    interleave_rows_to_pairs(s, BKp, nr, nkp, p_t, BKp);
    interleave_rows_to_pairs(dp, BKp, nr, nkp, ds_t, BKp);
    pack_value_pairs(dout, b, qt.h, qt.i0, nr, p.Dv, Dvp, do_pairs, /*sanitize=*/false);
    pack_value_pairs(q, b, qt.h, qt.i0, nr, p.D, Dp, q_pairs, /*sanitize=*/false);
    if constexpr (kAmx) {
      // On tiles: A row-major, [key][row pair].
      const int64_t ldt = plan.ld_t_rows;
      uint32_t* p_rows = as_words(plan.buf.p_t_rows.in(w));
      uint32_t* ds_rows = as_words(plan.buf.ds_t_rows.in(w));
      transpose_words(p_t, BKp, nr2, nkp, p_rows, ldt);
      transpose_words(ds_t, BKp, nr2, nkp, ds_rows, ldt);
      gemm_pairs<true>(nk, Dvp, nr2, p_rows, ldt, 1, do_pairs, Dvp, W, dvt, Dvp);
      gemm_pairs<true>(nk, Dp, nr2, ds_rows, ldt, 1, q_pairs, Dp, W, dkt, Dp);
    } else {
      gemm_pairs<true>(nk, Dvp, nr2, p_t, 1, BKp, do_pairs, Dvp, W, dvt, Dvp);
      gemm_pairs<true>(nk, Dp, nr2, ds_t, 1, BKp, q_pairs, Dp, W, dkt, Dp);
    }
    for (int64_t r = 0; r < nr; ++r) round_to_pairs(dp + r * BKp, nkp, ds_pairs + r * (BKp / 2));
    const uint32_t* k_words = as_words(plan.buf.k_rows.in(w));
    gemm_pairs<true>(nr, Dp, (nk + 1) / 2, ds_pairs, BKp / 2, 1, k_words, Dp, W, dqr, Dp);
    if (!kt.k_finite)
      add_nonfinite_values(k, b, hk, kt.j0, nk, p.D, ds_pairs, BKp / 2, nr, dqr, Dp);
  }
#endif

  // dK (scaled) and dV of the key tile to their rows.
  void write_key_grads(int64_t b, int64_t hk, const KeyTile& kt, Scratch& w) const {
    float* dkt = plan.buf.dk.in(w);
    const float* dvt = plan.buf.dv.in(w);
    const vf sc = splat(scale);
    for (int64_t e = 0; e < kt.nk * plan.Dp; e += W) store(dkt + e, load(dkt + e) * sc);
    for (int64_t jj = 0; jj < kt.nk; ++jj) {
      store_row(dkt + jj * plan.Dp, p.D, dk.dtype, dk.row(b, hk, kt.j0 + jj));
      store_row(dvt + jj * plan.Dvp, p.Dv, dv.dtype, dv.row(b, hk, kt.j0 + jj));
    }
  }

  // Key tiles [kt0, kt1) of kv head (b, hk): writes their dk, dv rows and adds dS K of the group's
  // query heads into dq_acc [group x Lq x Dp] (unscaled). Per key tile and query tile, the
  // forward's passes in reverse: scores (S, dP), then dS, then the three gradient products.
  void run(int64_t b, int64_t hk, int64_t kt0, int64_t kt1, float* dq_acc, Scratch& w) const {
    for (int64_t kt_i = kt0; kt_i < kt1; ++kt_i) {
      const KeyTile kt = pack_key_tile(b, hk, kt_i, w);
      std::fill_n(plan.buf.dk.in(w), kt.nk * plan.Dp, 0.0f);
      std::fill_n(plan.buf.dv.in(w), kt.nk * plan.Dvp, 0.0f);
      for (int64_t g = 0; g < p.group; ++g) {
        const int64_t h = hk * p.group + g;
        const RowScorer rs(p, b, h);
        for (int64_t qt_i = 0; qt_i < plan.n_qt; ++qt_i) {
          const int64_t i0 = qt_i * plan.BQ, i1 = std::min(p.Lq, i0 + plan.BQ);
          const TileInfo t = rs.classify(i0, i1, kt.j0, kt.j1);
          if (t.skip) continue;
          const QueryTile qt = score_tile(b, h, i0, i1 - i0, kt, w);
          ds_tile(rs, t, b, qt, kt, w);
          accumulate_grads(t, b, hk, qt, kt, dq_acc + (g * p.Lq + i0) * plan.Dp, w);
        }
      }
      write_key_grads(b, hk, kt, w);
    }
  }

  void write_dq(int64_t b, int64_t hk, const float* dq_acc, float* tmp) const {
    const vf sc = splat(scale);
    for (int64_t g = 0; g < p.group; ++g) {
      const int64_t h = hk * p.group + g;
      for (int64_t i = 0; i < p.Lq; ++i) {
        const float* src = dq_acc + (g * p.Lq + i) * plan.Dp;
        for (int64_t d = 0; d < plan.Dp; d += W) store(tmp + d, load(src + d) * sc);
        store_row(tmp, p.D, dq.dtype, dq.row(b, h, i));
      }
    }
  }
};

inline void backward_impl(const contract::BackwardProblem& p) {
  if (p.B == 0 || p.Hkv == 0) return;
  Bwd bwd(p);
  const BwdPlan& plan = bwd.plan;
  const int workers = std::max(1, resolve_threads(p.threads));
  const int64_t pairs = p.B * p.Hkv;
  const int64_t dq_per_pair = p.group * p.Lq * plan.Dp;

  // d(scores) of removed keys and skipped tiles is 0; the tiles that run overwrite their part.
  if (p.dscores.defined()) Tensor(p.dscores).fill(0.0);  // a view: shares the storage
  bwd.di.assign(static_cast<size_t>(p.B * p.Hq * p.Lq), 0.0f);

  if (plan.n_kt == 0 || plan.chunks == 1) {
    // One task per (b, kv head): it computes D of its query heads' rows, and owns that pair's dQ,
    // accumulated in per-worker memory. One parallel region: each one wakes the team.
    std::vector<std::vector<float, AlignedAlloc<float>>> dq_acc(static_cast<size_t>(workers));
    parallel_for(pairs, p.threads, [&](int64_t t, int worker) {
      const TileScope tiles(bwd.pairs);  // one tile configuration per task (amx targets)
      auto& acc = dq_acc[static_cast<size_t>(worker)];
      acc.assign(static_cast<size_t>(dq_per_pair), 0.0f);
      Scratch& w = worker_scratch(plan.total);
      const int64_t b = t / p.Hkv, hk = t % p.Hkv;
      for (int64_t g = 0; g < p.group; ++g) bwd.compute_di(w, b, hk * p.group + g);
      bwd.run(b, hk, 0, plan.n_kt, acc.data(), w);
      bwd.write_dq(b, hk, acc.data(), plan.buf.row.in(w));
    });
    return;
  }
  // Few pairs: (pair, chunk of key tiles) tasks with dQ partials; every chunk reads D of all the
  // pair's rows, computed first. The task that finishes a pair's last chunk sums its partials in
  // chunk order.
  parallel_for(p.B * p.Hq, p.threads, [&](int64_t t, int worker) {
    bwd.compute_di(worker_scratch(plan.total), t / p.Hq, t % p.Hq);
  });
  std::vector<float, AlignedAlloc<float>> part(
      static_cast<size_t>(pairs * plan.chunks * dq_per_pair), 0.0f);
  GroupCountdown chunks_left(pairs, plan.chunks);
  auto sum_chunks = [&](int64_t pair, Scratch& w) {
    float* sum = part.data() + pair * plan.chunks * dq_per_pair;
    for (int64_t c = 1; c < plan.chunks; ++c) {
      const float* src = sum + c * dq_per_pair;
      for (int64_t e = 0; e < dq_per_pair; e += W) store(sum + e, load(sum + e) + load(src + e));
    }
    bwd.write_dq(pair / p.Hkv, pair % p.Hkv, sum, plan.buf.row.in(w));
  };
  parallel_for(pairs * plan.chunks, p.threads, [&](int64_t t, int worker) {
    const TileScope tiles(bwd.pairs);
    const int64_t pair = t / plan.chunks, c = t % plan.chunks;
    const int64_t kt0 = c * plan.tiles_per_chunk,
                  kt1 = std::min(plan.n_kt, kt0 + plan.tiles_per_chunk);
    Scratch& w = worker_scratch(plan.total);
    bwd.run(pair / p.Hkv, pair % p.Hkv, kt0, kt1, part.data() + t * dq_per_pair, w);
    if (chunks_left.finish(pair)) sum_chunks(pair, w);
  });
}
