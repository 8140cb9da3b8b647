// The backward of the cpu backend (included inside namespace attn::cpu::<isa>, after the forward).
//
//   dout [B, Hq, Lq, Dv], q, k, v, out, lse  ->  dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D], dv [B, Hkv,
//   Lk, Dv]
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
  int64_t off_kt = 0, off_vt = 0, off_k_rows = 0, off_dk = 0, off_dv = 0, off_q = 0, off_do = 0,
          off_s = 0, off_dp = 0, off_tanh = 0, off_bias = 0, off_row = 0, off_row2 = 0, total = 0;
  // bf16 pairs (bf16_dot-inl.h): P^T and dS^T interleaved by row pairs, dS by key pairs, Q and dO
  // interleaved by row pairs.
  int64_t off_p_t = 0, off_ds_t = 0, off_ds_pairs = 0, off_q_pairs = 0, off_do_pairs = 0;
  // amx targets: P^T and dS^T transposed to [key][row pair] words (row-major A for the tiles).
  int64_t off_p_t_rows = 0, off_ds_t_rows = 0, ld_t_rows = 0;
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
  int64_t o = 0;
  auto take = [&](int64_t n) {
    const int64_t at = o;
    o += round_up(std::max<int64_t>(n, 1), 16);
    return at;
  };
  plan.off_kt = take(p.D * plan.BKp);
  plan.off_vt = take(p.Dv * plan.BKp);
  plan.off_k_rows = take(plan.BK * plan.Dp);
  plan.off_dk = take(plan.BK * plan.Dp);
  plan.off_dv = take(plan.BK * plan.Dvp);
  plan.off_q = take(plan.BQ * plan.Dp);
  plan.off_do = take(plan.BQ * plan.Dvp);
  plan.off_s = take(plan.BQ * plan.BKp);
  plan.off_dp = take(plan.BQ * plan.BKp);
  plan.off_tanh = take(p.softcap > 0 ? plan.BQ * plan.BKp : 1);
  plan.off_bias = take(plan.BKp);
  plan.off_row = take(W * std::max(plan.Dp, plan.Dvp) + W);  // W converted rows (pack_panels)
  plan.off_row2 = take(std::max(plan.Dp, plan.Dvp) + W);
  if (backward_on_pairs(p)) {
    const int64_t rows2 = (plan.BQ + 1) / 2;
    plan.off_p_t = take(rows2 * plan.BKp);
    plan.off_ds_t = take(rows2 * plan.BKp);
    plan.off_ds_pairs = take(plan.BQ * plan.BKp / 2);
    plan.off_q_pairs = take(rows2 * plan.Dp);
    plan.off_do_pairs = take(rows2 * plan.Dvp);
    if (kAmx) {
      plan.ld_t_rows = round_up(rows2, W);
      plan.off_p_t_rows = take(plan.BKp * plan.ld_t_rows);
      plan.off_ds_t_rows = take(plan.BKp * plan.ld_t_rows);
    }
  }
  plan.total = o;
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
    float* a = w.at(plan.off_row);
    float* c = w.at(plan.off_row2);
    for (int64_t i = 0; i < p.Lq; ++i) {
      load_row(dout.row(b, h, i), dout.dtype, p.Dv, a);
      load_row(o.row(b, h, i), o.dtype, p.Dv, c);
      float acc = 0.0f;
      for (int64_t d = 0; d < p.Dv; ++d) acc += a[d] * c[d];
      di[static_cast<size_t>((b * p.Hq + h) * p.Lq + i)] = acc;
    }
  }

  // Key tiles [kt0, kt1) of kv head (b, hk): writes their dk, dv rows and adds dS K of the group's
  // query heads into dq_acc [group x Lq x Dp] (unscaled).
  void run(int64_t b, int64_t hk, int64_t kt0, int64_t kt1, float* dq_acc, Scratch& w) const {
    const int64_t D = p.D, Dv = p.Dv, BQ = plan.BQ, BK = plan.BK, BKp = plan.BKp, Dp = plan.Dp,
                  Dvp = plan.Dvp;
    float* kt = w.at(plan.off_kt);
    float* vt = w.at(plan.off_vt);
    float* k_rows = w.at(plan.off_k_rows);
    float* dkt = w.at(plan.off_dk);
    float* dvt = w.at(plan.off_dv);
    float* qs = w.at(plan.off_q);
    float* do_rows = w.at(plan.off_do);
    float* s = w.at(plan.off_s);
    float* dp = w.at(plan.off_dp);
    float* tanh_s = w.at(plan.off_tanh);
    float* bias = w.at(plan.off_bias);
    float* tmp = w.at(plan.off_row);
    const bool dropout = p.dropout.active(), softcap = p.softcap > 0;
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t kt_i = kt0; kt_i < kt1; ++kt_i) {
      const int64_t j0 = kt_i * BK, j1 = std::min(p.Lk, j0 + BK), nk = j1 - j0,
                    nkp = round_up(nk, W);
      // K rows as the B operand of dQ += dS K: in place when f32 with rows of whole vectors.
      const float* kb = k_rows;
      int64_t ldk = Dp;
      bool k_finite = true;
#if defined(ATTN_CPU_BF16_DOT)
      if (pairs) {
        // K^T and V^T in panels of pairs (over D, Dv); K interleaved by key pairs, inf / NaN
        // as 0 (their terms of dQ are added apart, as in the forward's P V).
        pack_pair_panels(k, b, hk, j0, nk, D, as_words(kt), as_words(tmp));
        pack_pair_panels(v, b, hk, j0, nk, Dv, as_words(vt), as_words(tmp));
        k_finite = !pack_value_pairs(k, b, hk, j0, nk, D, Dp, as_words(k_rows));
      }
#endif
      if (!pairs) {
        pack_panels(k, b, hk, j0, nk, D, kt, tmp);
        pack_panels(v, b, hk, j0, nk, Dv, vt, tmp);
        if (k.dtype == DType::f32 && D == Dp) {
          kb = reinterpret_cast<const float*>(k.row(b, hk, j0)), ldk = k.s2;
        } else {
          pack_rows(k, b, hk, j0, nk, D, Dp, k_rows);
        }
        for (int64_t jj = 0; jj < nk && k_finite; ++jj) k_finite = all_finite(kb + jj * ldk, Dp);
      }
      std::fill(dkt, dkt + nk * Dp, 0.0f);
      std::fill(dvt, dvt + nk * Dvp, 0.0f);
      for (int64_t g = 0; g < p.group; ++g) {
        const int64_t h = hk * p.group + g;
        const RowScorer rs(p, b, h);
        for (int64_t qt = 0; qt < plan.n_qt; ++qt) {
          const int64_t i0 = qt * BQ, i1 = std::min(p.Lq, i0 + BQ), nr = i1 - i0;
          const TileInfo t = rs.classify(i0, i1, j0, j1);
          if (t.skip) continue;
          // Q and dO rows: in place when f32 with rows of whole vectors, else packed.
          const float* qb = qs;
          const float* dob = do_rows;
          int64_t ldq = Dp, lddo = Dvp;
#if defined(ATTN_CPU_BF16_DOT)
          if (pairs) {
            // S = Q K^T and dP = dO V^T on rows of pairs.
            const int64_t d2 = (D + 1) / 2, dv2 = (Dv + 1) / 2;
            for (int64_t r = 0; r < nr; ++r) {
              load_pairs(q.row(b, h, i0 + r), D, as_words(qs) + r * d2);
              load_pairs(dout.row(b, h, i0 + r), Dv, as_words(do_rows) + r * dv2);
            }
            gemm_pairs<false>(nr, nkp, d2, as_words(qs), d2, 1, as_words(kt), W, d2 * W, s, BKp);
            gemm_pairs<false>(nr, nkp, dv2, as_words(do_rows), dv2, 1, as_words(vt), W, dv2 * W, dp,
                              BKp);
          }
#endif
          if (!pairs) {
            if (q.dtype == DType::f32 && D == Dp) {
              qb = reinterpret_cast<const float*>(q.row(b, h, i0)), ldq = q.s2;
            } else {
              pack_rows(q, b, h, i0, nr, D, Dp, qs);
            }
            if (dout.dtype == DType::f32 && Dv == Dvp) {
              dob = reinterpret_cast<const float*>(dout.row(b, h, i0)), lddo = dout.s2;
            } else {
              pack_rows(dout, b, h, i0, nr, Dv, Dvp, do_rows);
            }
            gemm<false>(nr, nkp, D, qb, ldq, 1, kt, W, D * W, s, BKp);
            gemm<false>(nr, nkp, Dv, dob, lddo, 1, vt, W, Dv * W, dp, BKp);
          }
          for (int64_t r = 0; r < nr; ++r) {
            const int64_t i = i0 + r;
            float* sr = s + r * BKp;
            float* dpr = dp + r * BKp;
            float* thr = tanh_s + r * BKp;
            const vf factor = splat(rs.finish_row(t, i, j0, nk, sr, softcap ? thr : nullptr, bias));
            const float row_lse = *reinterpret_cast<const float*>(lse.row(b, h, i));
            if (row_lse == ninf) {
              // A row without allowed keys has P = 0 and every gradient 0.
              std::fill(sr, sr + nkp, 0.0f);
              std::fill(dpr, dpr + nkp, 0.0f);
            } else {
              // kept / (1 - p) per key under dropout, built in `bias` (finish_row is done with it).
              if (dropout) {
                std::fill(bias, bias + nkp, keep_scale);
                drop_row(p.dropout, b, h, i, j0, nk, bias);
              }
              const vf lv = splat(row_lse),
                       dv_i = splat(di[static_cast<size_t>((b * p.Hq + h) * p.Lq + i)]);
              for (int64_t j = 0; j < nkp; j += W) {
                const vf pr = vexp(load(sr + j) * factor - lv);
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
              store_row(dpr, nk, DType::f32, dscores.row(b, h, i) + j0 * dscores.item);
            }
            if (softcap) {
              // Select, not multiply: a removed key has dS = 0 but its tanh may be NaN (its k is
              // inf or NaN), and 0 * NaN would carry it into dQ and its own dK.
              for (int64_t j = 0; j < nkp; j += W) {
                const vf tv = load(thr + j), ds = load(dpr + j);
                store(dpr + j, ds == 0.0f ? vf{} : ds * (1.0f - tv * tv));
              }
            }
          }
          // dV += P^T dO, dK += dS^T Q, dQ += dS K (both scaled when written).
          float* dqr = dq_acc + (g * p.Lq + i0) * Dp;
#if defined(ATTN_CPU_BF16_DOT)
          if (pairs) {
            // Row-pair reductions: P^T and dS^T against Q and dO interleaved by row pairs (as
            // they are: a NaN query row reaches dK as in f32); then dS by key pairs against K.
            const int64_t nr2 = (nr + 1) / 2;
            uint32_t* p_t = as_words(w.at(plan.off_p_t));
            uint32_t* ds_t = as_words(w.at(plan.off_ds_t));
            uint32_t* ds_pairs = as_words(w.at(plan.off_ds_pairs));
            uint32_t* q_pairs = as_words(w.at(plan.off_q_pairs));
            uint32_t* do_pairs = as_words(w.at(plan.off_do_pairs));
            interleave_rows_to_pairs(s, BKp, nr, nkp, p_t, BKp);
            interleave_rows_to_pairs(dp, BKp, nr, nkp, ds_t, BKp);
            pack_value_pairs(dout, b, h, i0, nr, Dv, Dvp, do_pairs, /*sanitize=*/false);
            pack_value_pairs(q, b, h, i0, nr, D, Dp, q_pairs, /*sanitize=*/false);
            if constexpr (kAmx) {
              // On tiles: A row-major, [key][row pair].
              const int64_t ldt = plan.ld_t_rows;
              uint32_t* p_rows = as_words(w.at(plan.off_p_t_rows));
              uint32_t* ds_rows = as_words(w.at(plan.off_ds_t_rows));
              transpose_words(p_t, BKp, nr2, nkp, p_rows, ldt);
              transpose_words(ds_t, BKp, nr2, nkp, ds_rows, ldt);
              gemm_pairs<true>(nk, Dvp, nr2, p_rows, ldt, 1, do_pairs, Dvp, W, dvt, Dvp);
              gemm_pairs<true>(nk, Dp, nr2, ds_rows, ldt, 1, q_pairs, Dp, W, dkt, Dp);
            } else {
              gemm_pairs<true>(nk, Dvp, nr2, p_t, 1, BKp, do_pairs, Dvp, W, dvt, Dvp);
              gemm_pairs<true>(nk, Dp, nr2, ds_t, 1, BKp, q_pairs, Dp, W, dkt, Dp);
            }
            for (int64_t r = 0; r < nr; ++r)
              round_to_pairs(dp + r * BKp, nkp, ds_pairs + r * (BKp / 2));
            gemm_pairs<true>(nr, Dp, (nk + 1) / 2, ds_pairs, BKp / 2, 1, as_words(k_rows), Dp, W,
                             dqr, Dp);
            if (!k_finite)
              add_nonfinite_values(k, b, hk, j0, nk, D, ds_pairs, BKp / 2, nr, dqr, Dp);
            continue;
          }
#endif
          gemm<true>(nk, Dvp, nr, s, 1, BKp, dob, lddo, W, dvt, Dvp);
          gemm<true>(nk, Dp, nr, dp, 1, BKp, qb, ldq, W, dkt, Dp);
          if (k_finite || !(t.positional || t.biased || dropout)) {
            gemm<true>(nr, Dp, nk, dp, BKp, 1, kb, ldk, W, dqr, Dp);
          } else {
            gemm_skip_zeros(nr, Dp, nk, dp, BKp, 1, kb, ldk, dqr, Dp);
          }
        }
      }
      const vf sc = splat(scale);
      for (int64_t e = 0; e < nk * Dp; e += W) store(dkt + e, load(dkt + e) * sc);
      for (int64_t jj = 0; jj < nk; ++jj) {
        store_row(dkt + jj * Dp, D, dk.dtype, dk.row(b, hk, j0 + jj));
        store_row(dvt + jj * Dvp, Dv, dv.dtype, dv.row(b, hk, j0 + jj));
      }
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
  // Scratch lives per OS thread and is kept between calls (small problems would otherwise spend
  // much of their time allocating and zeroing it); every buffer is written before it is read.
  auto scratch_of = [&](int) -> Scratch& {
    thread_local Scratch w;
    if (w.buf.size() < static_cast<size_t>(plan.total))
      w.buf.resize(static_cast<size_t>(plan.total));
    return w;
  };
  const int64_t pairs = p.B * p.Hkv;
  const int64_t dq_per_pair = p.group * p.Lq * plan.Dp;

  // d(scores) of removed keys and skipped tiles is 0; the tiles that run overwrite their part.
  if (p.dscores.defined()) Tensor(p.dscores).fill(0.0);  // a view: shares the storage
  bwd.di.assign(static_cast<size_t>(p.B * p.Hq * p.Lq), 0.0f);
  parallel_for(p.B * p.Hq, p.threads, [&](int64_t t, int worker) {
    bwd.compute_di(scratch_of(worker), t / p.Hq, t % p.Hq);
  });

  if (plan.n_kt == 0 || plan.chunks == 1) {
    // One task per (b, kv head): it owns that pair's dQ too, accumulated in per-worker memory.
    std::vector<std::vector<float, AlignedAlloc<float>>> dq_acc(static_cast<size_t>(workers));
    parallel_for(pairs, p.threads, [&](int64_t t, int worker) {
      const TileScope tiles(bwd.pairs);  // one tile configuration per task (amx targets)
      auto& acc = dq_acc[static_cast<size_t>(worker)];
      acc.assign(static_cast<size_t>(dq_per_pair), 0.0f);
      Scratch& w = scratch_of(worker);
      bwd.run(t / p.Hkv, t % p.Hkv, 0, plan.n_kt, acc.data(), w);
      bwd.write_dq(t / p.Hkv, t % p.Hkv, acc.data(), w.at(plan.off_row));
    });
    return;
  }
  // Few pairs: (pair, chunk of key tiles) tasks with dQ partials, summed in chunk order.
  std::vector<float, AlignedAlloc<float>> part(
      static_cast<size_t>(pairs * plan.chunks * dq_per_pair), 0.0f);
  parallel_for(pairs * plan.chunks, p.threads, [&](int64_t t, int worker) {
    const TileScope tiles(bwd.pairs);
    const int64_t pair = t / plan.chunks, c = t % plan.chunks;
    const int64_t kt0 = c * plan.tiles_per_chunk,
                  kt1 = std::min(plan.n_kt, kt0 + plan.tiles_per_chunk);
    bwd.run(pair / p.Hkv, pair % p.Hkv, kt0, kt1, part.data() + t * dq_per_pair,
            scratch_of(worker));
  });
  parallel_for(pairs, p.threads, [&](int64_t pair, int worker) {
    float* sum = part.data() + pair * plan.chunks * dq_per_pair;
    for (int64_t c = 1; c < plan.chunks; ++c) {
      const float* src = sum + c * dq_per_pair;
      for (int64_t e = 0; e < dq_per_pair; e += W) store(sum + e, load(sum + e) + load(src + e));
    }
    bwd.write_dq(pair / p.Hkv, pair % p.Hkv, sum, scratch_of(worker).at(plan.off_row));
  });
}
