// The decode forward of the cpu backend: few query rows against a long KV cache (included inside
// namespace attn::cpu::<isa>, after online_softmax-inl.h and before attention_fwd-inl.h, whose
// forward_impl calls decode_forward first).
//
//   q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv], lse [B, Hq, Lq]
//
// Decode is bandwidth-bound: every key is used by Lq rows only, so the kernel's job is to stream K
// and V once, with no work between the loads that could stall the stream. One task = (b, kv head
// hk, a chunk of keys) and holds ALL the R = group x Lq query rows that read hk (the query heads of
// a GQA group and the speculative-decoding rows), so K and V are read once per group, not once per
// query head. Per block of W keys (W = floats per vector; the block sits in L1 while the R rows use
// it):
//   scores   (decode_scores-inl.h) per key and row a vector of W partial dot products over D (K
//            read in place; bf16 taken in pairs, by VDPBF16PS on the avx512bf16 target, else split
//            into its even and odd elements by a shift and a mask), then a transpose-add reduction
//            of the W vectors of a row into one vector of its W scores;
//   softmax  scale, softcap, ALiBi, the position rule by selection (s = -inf, never arithmetic, so
//            a NaN of a removed key vanishes), the online max m, O rescaled only when m grows,
//            the running sum l kept as a vector;
//   P V      O_r += sum_j p_rj v_j, V read in place; blocks with a removed key visit only the
//            allowed keys of each row (0 * inf must not reach O).
// Split-KV as in the tiled forward: when there are few (b, hk) pairs the keys are cut into chunks
// by a rule that depends on the shape only, and the chunks' (O, m, l) are merged in chunk order, so
// the result is bitwise the same for any thread count.
//
// Quantized keys and values (int8 with a scale per key, ForwardProblem::k_scale / v_scale): the
// elements are widened exactly, each block's scores multiplied by its keys' scales before the
// softmax and P by the values' scales after it (l sums P unscaled): R x W products a block instead of
// one per element.
//
// Taken here: f32 and bf16 inputs (int8 K and V with scales), Lq <= kDecodeMaxLq, group x Lq <= kDecodeMaxRows, with key
// lengths, causal / window in both alignments, ALiBi, softcap, GQA, any scale. Left to the tiled
// forward: dense masks, block layouts, dropout, returned weights, f16 inputs.

inline constexpr int64_t kDecodeMaxLq = 8;     // longer query blocks are GEMM-shaped: tiled forward
inline constexpr int64_t kDecodeMaxRows = 64;  // query rows per (b, kv head)
// Split-KV: at least this many (b, kv head, chunk) tasks, chunks of at least kDecodeMinChunk keys.
// Constants, not the thread count: results must not depend on it.
inline constexpr int64_t kDecodeMinTasks = 64;
inline constexpr int64_t kDecodeMinChunk = 512;
inline constexpr int64_t kDecodeChunkAlign = 64;  // chunk boundaries: a multiple of every W

// One query row of a decode task.
struct DecodeRow {
  int64_t h = 0, i = 0;    // query head and row
  int64_t lo = 0, hi = 0;  // allowed keys [lo, hi) by the position rule and the key length
  float pos = 0.0f;        // p(i), for ALiBi
  float slope = 0.0f;
  bool nan = false;     // a NaN score of an allowed key: the row is NaN (docs/semantics.md)
  bool active = false;  // this block has an allowed key with a finite max: P V adds to O
};

// Whether K and V of element type T are quantized (their scales apply to scores and P).
template <class T>
inline constexpr bool kQuantized = std::is_same_v<T, int8_t>;

struct Decode {
  const contract::ForwardProblem& p;
  View4 q, k, v, out, lse;
  View4 k_scale, v_scale;  // quantized K and V: [.., Hkv, keys, 1] views of the scales
  float scale = 1.0f, softcap = 0.0f;
  int64_t R = 0, Dp = 0, Dvp = 0;   // rows per task, D and Dv rounded up to W
  int64_t Dp2 = 0;                  // D rounded up to kBf16KStep (the rows for bf16 K)
  int64_t n_chunks = 1, chunk = 0;  // split-KV
  int64_t total = 0;                // scratch floats per task
  PrefetchLevel prefetch_level = decode_prefetch_level();
  // The scratch buffers of a task (floats unless said).
  struct Buffers {
    Slot q;   // the R query rows [R x Dp]
    Slot qk;  // the rows for bf16 K [R x Dp2]: bf16 values for VDPBF16PS (a row's Dp2 values in the
              // first half of its Dp2 floats), else the f32 rows split by pairs
    Slot o, l;  // the unnormalised output [R x Dvp]; l as a vector per row [R x W]
    Slot m;     // the running max [R]
    Slot s;     // scores, then P, of the current block [R x W]
    Slot row;   // one converted row [Dvp]
  } buf;

  explicit Decode(const contract::ForwardProblem& prob) : p(prob) {
    q = View4::of(p.q), k = View4::of(p.k), v = View4::of(p.v), out = View4::of(p.out);
    lse = View4::of(p.lse.unsqueeze(-1));
    if (p.k_scale.defined()) {
      k_scale = View4::of(p.k_scale.unsqueeze(-1)), v_scale = View4::of(p.v_scale.unsqueeze(-1));
    }
    scale = static_cast<float>(p.scale);
    softcap = static_cast<float>(p.softcap);
    R = p.group * p.Lq;
    Dp = round_up(p.D, W), Dvp = round_up(p.Dv, W), Dp2 = round_up(p.D, kBf16KStep);
    const int64_t pairs = p.B * p.Hkv;
    if (pairs < kDecodeMinTasks) {
      const int64_t by_size = std::max<int64_t>(1, p.Lk / kDecodeMinChunk);
      n_chunks = std::min((kDecodeMinTasks + pairs - 1) / pairs, by_size);
    }
    chunk = round_up((std::max<int64_t>(p.Lk, 1) + n_chunks - 1) / n_chunks, kDecodeChunkAlign);
    n_chunks = std::max<int64_t>(1, (p.Lk + chunk - 1) / chunk);
    ScratchLayout layout;
    auto take = [&](int64_t n) { return layout.take(n); };
    buf.q = take(R * Dp);
    buf.qk = take(R * Dp2);
    buf.o = take(R * Dvp);
    buf.l = take(R * W);  // l as a vector per row
    buf.m = take(R);
    buf.s = take(R * W);  // scores, then P, of the current block
    buf.row = take(Dvp);
    total = layout.total;
  }

  // Keys in pages (p.pages) are read in place when every block of W keys lies in one page: pages
  // a multiple of W keys, and blocks starting at multiples of W (no window's left bound moves the
  // first key; chunk boundaries are multiples of kDecodeChunkAlign).
  static bool handles(const contract::ForwardProblem& p) {
    auto fits = [](const Tensor& t) { return t.dtype() == DType::f32 || t.dtype() == DType::bf16; };
    const bool pages_fit =
        p.pages.table == nullptr || (p.pages.block_size % W == 0 && p.rule.left < 0);
    const bool kv_fit = p.k.dtype() == DType::i8
                            ? p.v.dtype() == DType::i8 && p.k_scale.defined() && p.v_scale.defined()
                            : fits(p.k) && p.k.dtype() == p.v.dtype();
    return p.Lq <= kDecodeMaxLq && p.group * p.Lq <= kDecodeMaxRows && !p.mask.defined() &&
           !p.block_layout.defined() && !p.dropout.active() && !p.weights.defined() && fits(p.q) &&
           kv_fit && fits(p.out) && pages_fit;
  }

  // The K (or V) rows of the task (b, hk): row j at base + j * ld, or in p.pages, row j % block_size
  // of block table[j / block_size] (one branch per block of W keys).
  template <class T>
  struct TaskRows {
    const T* base = nullptr;
    int64_t ld = 0;
    const int32_t* table = nullptr;  // this batch entry's row of the block table
    int64_t block_size = 0, block_ld = 0;
    const T* at(int64_t j) const {
      if (table == nullptr) return base + j * ld;
      return base + table[j / block_size] * block_ld + (j % block_size) * ld;
    }
  };
  template <class T>
  TaskRows<T> task_rows(const View4& x, int64_t b, int64_t hk) const {
    TaskRows<T> r;
    r.base = reinterpret_cast<const T*>(x.row(p.pages.table ? 0 : b, hk, 0));
    r.ld = x.s2;
    if (p.pages.table != nullptr) {
      r.table = p.pages.table + b * p.pages.table_stride;
      r.block_size = p.pages.block_size, r.block_ld = x.s0;
    }
    return r;
  }

  // The scales of keys [j0, j0 + nk) (one block of W, inside one page) of the rows sr into dst [W],
  // 1 beyond nk.
  static void block_scales(const TaskRows<float>& sr, int64_t j0, int64_t nk, float* dst) {
    const float* at = sr.at(j0);
    for (int64_t l = 0; l < W; ++l) dst[l] = l < nk ? at[l * sr.ld] : 1.0f;
  }

  // Quantized K: the block's scores times its keys' scales (before softmax_block's scale).
  void scale_scores(const float* kscale, float* w) const {
    float* s = buf.s.in(w);
    const vf ks = load(kscale);
    for (int64_t r = 0; r < R; ++r) store(s + r * W, load(s + r * W) * ks);
  }

  // The block's scores for quantized K and V (their scales [W] in ks, vs): scale_scores, then
  // softmax_block with P times the values' scales.
  template <class T>
  void score_and_softmax(const TaskRows<T>& kr, const TaskRows<float>& ksr,
                         const TaskRows<float>& vsr, int64_t j0, int64_t nk, bool full,
                         DecodeRow* rows, float* w, AheadLines* ahead) const {
    score_block(kr.at(j0), k.s2, nk, w, ahead);
    if constexpr (kQuantized<T>) {
      alignas(64) float ks[W], vs[W];
      block_scales(ksr, j0, nk, ks);
      block_scales(vsr, j0, nk, vs);
      scale_scores(ks, w);
      softmax_block(j0, nk, full, rows, w, vs);
    } else {
      (void)ksr, (void)vsr;
      softmax_block(j0, nk, full, rows, w, nullptr);
    }
  }

  // The scales of quantized K or V for (b, hk) (empty rows when there are none).
  TaskRows<float> scale_rows(const View4& x, int64_t b, int64_t hk) const {
    return x.base == nullptr ? TaskRows<float>{} : task_rows<float>(x, b, hk);
  }

  // The R query rows of (b, hk) into the scratch: f32 rows qf [R x Dp] (zero-padded), for bf16 the
  // rows qk as dot_rows takes them, each row's allowed keys and ALiBi terms.
  void load_rows(int64_t b, int64_t hk, DecodeRow* rows, float* w) const {
    const int64_t key_length = p.key_length_of(b), D = p.D;
    float* qf = buf.q.in(w);
    float* qk = buf.qk.in(w);
    for (int64_t r = 0; r < R; ++r) {
      DecodeRow& row = rows[r];
      row = DecodeRow{};
      row.h = hk * p.group + r / p.Lq, row.i = r % p.Lq;
      p.rule.key_range(row.i, key_length, &row.lo, &row.hi);
      row.pos = static_cast<float>(p.rule.pos(row.i));
      row.slope = p.alibi.empty() ? 0.0f : static_cast<float>(p.alibi[row.h]);
      load_row(q.row(b, row.h, row.i), q.dtype, D, qf + r * Dp);
      std::fill(qf + r * Dp + D, qf + (r + 1) * Dp, 0.0f);
#if defined(ATTN_CPU_BF16_DOT)
      if (q.dtype == DType::bf16) {
        uint16_t* qh = reinterpret_cast<uint16_t*>(qk + r * Dp2);
        std::memcpy(qh, q.row(b, row.h, row.i), static_cast<size_t>(D) * 2);
        std::memset(qh + D, 0, static_cast<size_t>(Dp2 - D) * 2);
      }
#endif
    }
#if !defined(ATTN_CPU_BF16_DOT)
    if (q.dtype == DType::bf16) split_rows(qf, Dp, D, R, qk, Dp2);
#endif
  }

  // s [R x W] = q_r . k_j for the nk <= W keys from kb0 (row stride ldk), four rows at a time.
  template <class T>
  void score_block(const T* kb0, int64_t ldk, int64_t nk, float* w, AheadLines* ahead) const {
    const float* qf = buf.q.in(w);
    const float* qk = buf.qk.in(w);
    float* s = buf.s.in(w);
    int64_t r0 = 0;
    for (; r0 + 4 <= R; r0 += 4)
      dot_rows<4>(qf + r0 * Dp, Dp, qk + r0 * Dp2, Dp2, p.D, kb0, ldk, nk, s + r0 * W, ahead);
    switch (R - r0) {
      case 3:
        dot_rows<3>(qf + r0 * Dp, Dp, qk + r0 * Dp2, Dp2, p.D, kb0, ldk, nk, s + r0 * W, ahead);
        break;
      case 2:
        dot_rows<2>(qf + r0 * Dp, Dp, qk + r0 * Dp2, Dp2, p.D, kb0, ldk, nk, s + r0 * W, ahead);
        break;
      case 1:
        dot_rows<1>(qf + r0 * Dp, Dp, qk + r0 * Dp2, Dp2, p.D, kb0, ldk, nk, s + r0 * W, ahead);
        break;
      default:
        break;
    }
  }

  // The scores of the block of keys [j0, j0 + nk) in the contract's order (scale, softcap, ALiBi),
  // removal by selection (unless every row may use every key: full), then the online softmax:
  // s[r * W + l] becomes p_r(j0 + l) (times vscale[l] for quantized V; l sums p unscaled), O and l of
  // a row are rescaled when its max grows.
  void softmax_block(int64_t j0, int64_t nk, bool full, DecodeRow* rows, float* w,
                     const float* vscale) const {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    float* o = buf.o.in(w);
    float* lv = buf.l.in(w);
    float* m = buf.m.in(w);
    float* s = buf.s.in(w);
    const bool alibi = !p.alibi.empty();
    const vf lanes = iota_f();
    for (int64_t r = 0; r < R; ++r) {
      DecodeRow& row = rows[r];
      row.active = false;
      if (row.nan) continue;
      vf sv = load(s + r * W) * scale;
      if (softcap > 0.0f) sv = vtanh(sv * (1.0f / softcap)) * softcap;
      if (alibi) sv -= row.slope * vabs(splat(row.pos - static_cast<float>(j0)) - lanes);
      if (!full) {
        const float a = static_cast<float>(std::clamp<int64_t>(row.lo - j0, -1, W));
        const float e = static_cast<float>(std::clamp<int64_t>(std::min(row.hi - j0, nk), -1, W));
        sv = ((lanes >= a) & (lanes < e)) ? sv : splat(ninf);
      }
      const float bm = hmax_nan(sv);
      if (std::isnan(bm)) {
        // A NaN score of an allowed key (NaN in q or k): the whole row is NaN, as IEEE says.
        row.nan = true;
        continue;
      }
      // Every key of the block is removed (or scores -inf): nothing to add, and no -inf - -inf.
      if (bm == ninf) continue;
      float* orow = o + r * Dvp;
      if (bm > m[r]) {
        if (m[r] != ninf) {  // m = -inf: O and l are still 0
          const vf alpha = splat(std::exp(m[r] - bm));
          for (int64_t c = 0; c < Dvp; c += W) store(orow + c, load(orow + c) * alpha);
          store(lv + r * W, load(lv + r * W) * alpha);
        }
        m[r] = bm;
      }
      const vf pv = vexp(sv - m[r]);
      store(s + r * W, vscale != nullptr ? pv * load(vscale) : pv);
      store(lv + r * W, load(lv + r * W) + pv);
      row.active = true;
    }
  }

  // O_r += sum_j p_rj v_j over the block of keys [j0, j0 + nk) whose first row is vb0 (row stride
  // ldv).
  template <class T>
  void add_pv_block(const T* vb0, int64_t ldv, int64_t j0, int64_t nk, bool full,
                    const DecodeRow* rows, float* w, AheadLines* ahead) const {
    const int64_t Dv = p.Dv;
    float* o = buf.o.in(w);
    float* s = buf.s.in(w);
    if (full) {
      // Four rows at a time; a row without work this block (NaN, or every score -inf) gets P = 0.
      for (int64_t r = 0; r < R; ++r) {
        if (!rows[r].active) std::fill(s + r * W, s + (r + 1) * W, 0.0f);
      }
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) pv_rows<4>(s + r * W, vb0, ldv, Dv, o + r * Dvp, Dvp, ahead);
      if (r + 2 <= R) pv_rows<2>(s + r * W, vb0, ldv, Dv, o + r * Dvp, Dvp, ahead), r += 2;
      if (r < R) pv_rows<1>(s + r * W, vb0, ldv, Dv, o + r * Dvp, Dvp, ahead);
      return;
    }
    // Only the allowed keys of each row: a removed key's V may be NaN or inf.
    for (int64_t r = 0; r < R; ++r) {
      const DecodeRow& row = rows[r];
      if (!row.active) continue;
      const int64_t a = std::max(row.lo, j0), e = std::min(row.hi, j0 + nk);
      float* orow = o + r * Dvp;
      for (int64_t j = a; j < e; ++j) {
        const vf pj = splat(s[r * W + (j - j0)]);
        const T* vr = vb0 + (j - j0) * ldv;
        int64_t c = 0;
        for (; c + W <= Dv; c += W) store(orow + c, load(orow + c) + pj * load_elems(vr + c));
        if (c < Dv) store(orow + c, load(orow + c) + pj * load_elems_tail(vr + c, Dv - c));
      }
    }
  }

  // Points the prefetch at the block kPrefetchBlocks<T> ahead of j0 (keys before je), or at nothing.
  template <class T>
  void aim(AheadLines& ahead, const TaskRows<T>& kr, const TaskRows<T>& vr, int64_t j0,
           int64_t je) const {
    constexpr int64_t esize = sizeof(T);
    const int64_t jp = j0 + kPrefetchBlocks<T> * W;
    if (jp < je) {  // (no pointer is formed past the rows)
      ahead.target(reinterpret_cast<const char*>(kr.at(jp)), k.s2 * esize, p.D * esize,
                   reinterpret_cast<const char*>(vr.at(jp)), v.s2 * esize, p.Dv * esize,
                   std::min<int64_t>(W, je - jp));
    } else {
      ahead.clear();
    }
  }

  // The whole blocks of W keys in [j0, je) for the one query row of a task (group 1, Lq 1: the
  // multi-head decode step, every key from js on allowed) at a head dim known when compiled (kD = D
  // = Dv, one of kRowLoopDims; no softcap, no ALiBi): score_block, softmax_block and add_pv_block
  // for R = 1 in one loop, every trip count a constant, the block's scores in registers
  // (dot_row_block), O, l, m and P in locals instead of the scratch. The same operations in the
  // same order as theirs: the same bits. The online softmax's rescale and exp repeat
  // softmax_block's: a helper shared by both (O, l, m by reference) ran bf16 here 13-26% slower,
  // and dropping the loop's redundant NaN test 7-14% (Zen 4, A/A within 2.5%): this loop's bf16 code
  // is sensitive to its form. Returns the first key not taken (the last block when partial, or
  // every block after a NaN).
  template <int kD, class T>
  int64_t row_blocks(const TaskRows<T>& kr, const TaskRows<T>& vr, int64_t j0, int64_t je,
                     DecodeRow& row, float* w, AheadLines& ahead) const {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    constexpr int64_t kDp = round_up(kD, W);
    alignas(64) float o[kDp], s[W];
    std::copy(buf.o.in(w), buf.o.in(w) + kDp, o);
    vf lv = load(buf.l.in(w));
    float m = *buf.m.in(w);
    for (; j0 + W <= je && !row.nan; j0 += W) {
      aim(ahead, kr, vr, j0, je);
      const vf sv = dot_row_block<kD>(buf.q.in(w), buf.qk.in(w), kr.at(j0), k.s2, &ahead) * scale;
      const float bm = hmax_nan(sv);
      if (std::isnan(bm)) {
        row.nan = true;  // the row is NaN whatever follows
        break;
      }
      vf pv = vf{};  // every score -inf: P = 0, as add_pv_block's inactive rows
      if (bm != ninf) {
        if (bm > m) {
          if (m != ninf) {
            const vf alpha = splat(std::exp(m - bm));
#pragma GCC unroll 8
            for (int64_t c = 0; c < kDp; c += W) store(o + c, load(o + c) * alpha);
            lv = lv * alpha;
          }
          m = bm;
        }
        pv = vexp(sv - m);
        lv = lv + pv;
      }
      store(s, pv);
      pv_rows<1>(s, vr.at(j0), v.s2, kD, o, kDp, &ahead);
      ahead.finish();
    }
    std::copy(o, o + kDp, buf.o.in(w));
    store(buf.l.in(w), lv);
    *buf.m.in(w) = m;
    return j0;
  }

  // Runs the R rows of (b, hk) over keys [kb, ke): leaves the unnormalised O [R x Dvp], m [R] and
  // l [R x W] (lane sums) in the scratch w; rows[] gets each row's NaN flag. Per block of W keys:
  // the scores (score_block), the online softmax (softmax_block), P V (add_pv_block).
  template <class T>
  void attend(int64_t b, int64_t hk, int64_t kb, int64_t ke, DecodeRow* rows, float* w) const {
    load_rows(b, hk, rows, w);
    std::fill(buf.o.in(w), buf.o.in(w) + R * Dvp, 0.0f);
    std::fill(buf.l.in(w), buf.l.in(w) + R * W, 0.0f);
    std::fill(buf.m.in(w), buf.m.in(w) + R, -std::numeric_limits<float>::infinity());
    // lo and hi are non-decreasing in i: row i = 0 has the smallest of both, i = Lq - 1 the
    // largest.
    const int64_t lo_min = rows[0].lo, hi_min = rows[0].hi;
    const int64_t lo_max = rows[p.Lq - 1].lo, hi_max = rows[p.Lq - 1].hi;
    const int64_t js = std::max(kb, lo_min), je = std::min(ke, hi_max);
    const TaskRows<T> kr = task_rows<T>(k, b, hk), vr = task_rows<T>(v, b, hk);
    const TaskRows<float> ksr = scale_rows(k_scale, b, hk), vsr = scale_rows(v_scale, b, hk);
    AheadLines ahead(prefetch_level);
    int64_t j0 = js;
    // One query row at a common head dim: its whole blocks in one loop (row_blocks), the rest below.
    // Not on the emulated AMX target, which exists to test the tile products: there its unrolled
    // bf16 dot emulation made each row_blocks 0.1-0.5 MB of code; its blocks give the same bits.
#if !defined(ATTN_CPU_AMX_EMULATED)
    if constexpr (!kQuantized<T>) {
      if (R == 1 && softcap == 0.0f && p.alibi.empty() && p.D == p.Dv) {
        // The first of kRowLoopDims equal to D, if any, runs.
        const auto run_rows = [&]<int... kD>(std::integer_sequence<int, kD...>) {
          (void)((p.D == kD && (j0 = row_blocks<kD>(kr, vr, j0, je, rows[0], w, ahead), true)) ||
                 ...);
        };
        run_rows(kRowLoopDims);
      }
    }
#endif
    for (; j0 < je; j0 += W) {
      const int64_t nk = std::min<int64_t>(W, je - j0);
      aim(ahead, kr, vr, j0, je);
      // Every row may use every key of the block: no selection, P V without per-row ranges.
      const bool full = nk == W && j0 >= lo_max && j0 + W <= hi_min;
      score_and_softmax(kr, ksr, vsr, j0, nk, full, rows, w, &ahead);
      add_pv_block(vr.at(j0), v.s2, j0, nk, full, rows, w, &ahead);
      ahead.finish();
    }
    float* m = buf.m.in(w);
    for (int64_t r = 0; r < R; ++r) {
      if (rows[r].nan) m[r] = std::numeric_limits<float>::quiet_NaN();
    }
  }

  // Whether attend_heads() serves p: keys whose rows hold every kv head side by side (token-major:
  // [num_blocks, block_size, Hkv, D] pools, packed [total, Hkv, D] rows), the layouts a (b, kv
  // head) task reads 1 / Hkv of. (Paged bf16 decode, Zen 5: 12.8 GB/s of K + V by (b, kv head)
  // tasks, docs/PERFORMANCE.md.)
  bool by_heads() const {
    return p.Hkv > 1 && k.s1 * p.Hkv == k.s2 && v.s1 * p.Hkv == v.s2 && k.s1 == p.D && v.s1 == p.Dv;
  }

  // Prefetches the block of keys kPrefetchBlocks<T> ahead of j0 for every kv head at once: in
  // pages its rows of all heads are one range of K and one of V.
  template <class T>
  void aim_heads(AheadLines& ahead, int64_t b, int64_t j0, int64_t je) const {
    constexpr int64_t esize = sizeof(T);
    const int64_t jp = j0 + kPrefetchBlocks<T> * W;
    if (jp < je) {
      ahead.target(reinterpret_cast<const char*>(task_rows<T>(k, b, 0).at(jp)), k.s2 * esize,
                   k.s2 * esize, reinterpret_cast<const char*>(task_rows<T>(v, b, 0).at(jp)),
                   v.s2 * esize, v.s2 * esize, std::min<int64_t>(W, je - jp));
    } else {
      ahead.clear();
    }
  }

  // attend() for every kv head of b over keys [kb, ke) (by_heads()): per block of W keys, head after
  // head, so that a page is read front to back instead of 1 / Hkv of it per task. Head hk's state is
  // in the scratch w + hk * total and its rows at rows + hk * R; per head the operations of attend()'s
  // block loop in its order (row_blocks gives the same bits as that loop): the same results.
  template <class T>
  void attend_heads(int64_t b, int64_t kb, int64_t ke, DecodeRow* rows, float* w) const {
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      float* wh = w + hk * total;
      load_rows(b, hk, rows + hk * R, wh);
      std::fill(buf.o.in(wh), buf.o.in(wh) + R * Dvp, 0.0f);
      std::fill(buf.l.in(wh), buf.l.in(wh) + R * W, 0.0f);
      std::fill(buf.m.in(wh), buf.m.in(wh) + R, -std::numeric_limits<float>::infinity());
    }
    // Every head's rows have the same key ranges (the rule depends on the row i only).
    const int64_t lo_min = rows[0].lo, hi_min = rows[0].hi;
    const int64_t lo_max = rows[p.Lq - 1].lo, hi_max = rows[p.Lq - 1].hi;
    const int64_t js = std::max(kb, lo_min), je = std::min(ke, hi_max);
    AheadLines ahead(prefetch_level);
    for (int64_t j0 = js; j0 < je; j0 += W) {
      const int64_t nk = std::min<int64_t>(W, je - j0);
      const bool full = nk == W && j0 >= lo_max && j0 + W <= hi_min;
      aim_heads<T>(ahead, b, j0, je);
      for (int64_t hk = 0; hk < p.Hkv; ++hk) {
        float* wh = w + hk * total;
        DecodeRow* rh = rows + hk * R;
        score_and_softmax(task_rows<T>(k, b, hk), scale_rows(k_scale, b, hk),
                          scale_rows(v_scale, b, hk), j0, nk, full, rh, wh, &ahead);
        add_pv_block(task_rows<T>(v, b, hk).at(j0), v.s2, j0, nk, full, rh, wh, &ahead);
      }
      ahead.finish();
    }
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      float* m = buf.m.in(w + hk * total);
      for (int64_t r = 0; r < R; ++r) {
        if (rows[hk * R + r].nan) m[r] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }

  // out = O / l, lse = m + log l for row r of the task (b, hk); l = 0: no allowed key, out = 0 and
  // lse = -inf; m = NaN: a NaN row.
  void write_row(int64_t b, const DecodeRow& row, const float* orow, float m, float l,
                 float* tmp) const {
    float* lse_at = reinterpret_cast<float*>(lse.row(b, row.h, row.i));
    if (std::isnan(m)) {
      std::fill(tmp, tmp + Dvp, std::numeric_limits<float>::quiet_NaN());
      *lse_at = m;
    } else if (l != 0.0f) {
      const vf inv = splat(1.0f / l);
      for (int64_t c = 0; c < Dvp; c += W) store(tmp + c, load(orow + c) * inv);
      *lse_at = m + std::log(l);
    } else {
      std::fill(tmp, tmp + Dvp, 0.0f);
      *lse_at = -std::numeric_limits<float>::infinity();
    }
    store_row(tmp, p.Dv, out.dtype, out.row(b, row.h, row.i));
  }
};

// The decode forward by tasks of every kv head (Decode::attend_heads): one task per (b, chunk of
// keys), the chunks of Decode's split rule, their partials merged per (b, kv head) in chunk order as
// decode_forward merges them: the same bits.
inline void decode_forward_heads(const Decode& dec) {
  const contract::ForwardProblem& p = dec.p;
  const int64_t R = dec.R, Dvp = dec.Dvp, n_chunks = dec.n_chunks, per = R * (Dvp + 2);
  std::vector<float, AlignedAlloc<float>> part(static_cast<size_t>(p.B * p.Hkv * n_chunks * per));
  GroupCountdown chunks_left(p.B, n_chunks);
  auto attend = [&](int64_t b, int64_t kb, int64_t ke, DecodeRow* rows, float* w) {
    if (dec.k.dtype == DType::f32) {
      dec.attend_heads<float>(b, kb, ke, rows, w);
    } else if (dec.k.dtype == DType::i8) {
      dec.attend_heads<int8_t>(b, kb, ke, rows, w);
    } else {
      dec.attend_heads<uint16_t>(b, kb, ke, rows, w);
    }
  };
  parallel_for(p.B * n_chunks, p.threads, [&](int64_t t, int) {
    float* w = worker_scratch(dec.total * p.Hkv).at(0);
    std::vector<DecodeRow> rows(static_cast<size_t>(R * p.Hkv));
    const int64_t b = t / n_chunks, c = t % n_chunks;
    attend(b, c * dec.chunk, std::min(p.Lk, (c + 1) * dec.chunk), rows.data(), w);
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      float* wh = w + hk * dec.total;
      float* dst = part.data() + ((b * p.Hkv + hk) * n_chunks + c) * per;
      std::copy(dec.buf.o.in(wh), dec.buf.o.in(wh) + R * Dvp, dst);
      for (int64_t r = 0; r < R; ++r) {
        dst[R * Dvp + r] = dec.buf.m.in(wh)[r];
        dst[R * (Dvp + 1) + r] = hsum(load(dec.buf.l.in(wh) + r * W));
      }
    }
    if (!chunks_left.finish(b)) return;
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {  // the last chunk of b merges every head of b
      float* o = dec.buf.o.in(w);
      for (int64_t r = 0; r < R; ++r) {
        DecodeRow row;
        row.h = hk * p.group + r / p.Lq, row.i = r % p.Lq;
        float l = 0.0f;
        const float mx = merge_partials_row(part.data() + (b * p.Hkv + hk) * n_chunks * per,
                                            n_chunks, R, Dvp, r, o, &l);
        dec.write_row(b, row, o, mx, l, dec.buf.row.in(w));
      }
    }
  });
}

// The decode forward, when the problem is one it takes (Decode::handles); false: the caller runs
// the tiled forward.
inline bool decode_forward(const contract::ForwardProblem& p) {
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0 || !Decode::handles(p)) return false;
  const Decode dec(p);
  if (dec.by_heads()) {
    decode_forward_heads(dec);
    return true;
  }
  const int64_t R = dec.R, Dvp = dec.Dvp, n_chunks = dec.n_chunks, pairs = p.B * p.Hkv;
  auto scratch = [&]() -> float* { return worker_scratch(dec.total).at(0); };
  auto attend = [&](int64_t b, int64_t hk, int64_t kb, int64_t ke, DecodeRow* rows, float* w) {
    if (dec.k.dtype == DType::f32) {
      dec.attend<float>(b, hk, kb, ke, rows, w);
    } else if (dec.k.dtype == DType::i8) {
      dec.attend<int8_t>(b, hk, kb, ke, rows, w);
    } else {
      dec.attend<uint16_t>(b, hk, kb, ke, rows, w);
    }
  };
  if (n_chunks == 1) {
    parallel_for(pairs, p.threads, [&](int64_t t, int) {
      float* w = scratch();
      DecodeRow rows[kDecodeMaxRows];
      const int64_t b = t / p.Hkv, hk = t % p.Hkv;
      attend(b, hk, 0, p.Lk, rows, w);
      for (int64_t r = 0; r < R; ++r) {
        dec.write_row(b, rows[r], dec.buf.o.in(w) + r * Dvp, dec.buf.m.in(w)[r],
                      hsum(load(dec.buf.l.in(w) + r * W)), dec.buf.row.in(w));
      }
    });
    return true;
  }
  // Split-KV: partial (O [R x Dvp], m [R], l [R]) per (pair, chunk); the task that finishes a
  // pair's last chunk merges them in chunk order, in the same parallel region.
  const int64_t per = R * (Dvp + 2);
  std::vector<float, AlignedAlloc<float>> part(static_cast<size_t>(pairs * n_chunks * per));
  GroupCountdown chunks_left(pairs, n_chunks);
  auto merge = [&](int64_t pair, float* w) {
    const int64_t b = pair / p.Hkv, hk = pair % p.Hkv;
    float* o = dec.buf.o.in(w);
    for (int64_t r = 0; r < R; ++r) {
      DecodeRow row;
      row.h = hk * p.group + r / p.Lq, row.i = r % p.Lq;
      float l = 0.0f;
      const float mx =
          merge_partials_row(part.data() + pair * n_chunks * per, n_chunks, R, Dvp, r, o, &l);
      dec.write_row(b, row, o, mx, l, dec.buf.row.in(w));
    }
  };
  parallel_for(pairs * n_chunks, p.threads, [&](int64_t t, int) {
    float* w = scratch();
    DecodeRow rows[kDecodeMaxRows];
    const int64_t pair = t / n_chunks, c = t % n_chunks;
    attend(pair / p.Hkv, pair % p.Hkv, c * dec.chunk, std::min(p.Lk, (c + 1) * dec.chunk), rows, w);
    float* dst = part.data() + t * per;
    std::copy(dec.buf.o.in(w), dec.buf.o.in(w) + R * Dvp, dst);
    for (int64_t r = 0; r < R; ++r) {
      dst[R * Dvp + r] = dec.buf.m.in(w)[r];
      dst[R * (Dvp + 1) + r] = hsum(load(dec.buf.l.in(w) + r * W));
    }
    if (chunks_left.finish(pair)) merge(pair, w);
  });
  return true;
}
