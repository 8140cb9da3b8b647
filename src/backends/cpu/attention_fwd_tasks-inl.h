// The forward's tasks (included inside namespace attn::cpu::<isa>, after attention_fwd-inl.h): the
// order the dynamic schedule hands them out in, and forward_impl, which runs them (row tasks, or
// row tasks cut into split-KV chunks whose partials the last chunk's task merges), then the
// weights when asked.

// The row tasks (id = (b * Hq + h) * n_groups + query group) in the order the dynamic schedule
// hands them out: head by head, and within a head its query groups by decreasing work (Fwd::work;
// ties in row order). Each head then ends with its shortest task, and so does the schedule: under a
// causal rule the first rows, under none the partial last group (handed out first before, it left
// one of two threads idle at the end: B·H 8, L 512, D 128 5.5% slower). Sorting all tasks by work
// instead interleaves the heads: 1.6-1.9% slower on causal rows at L 2048 (each task's K and V
// were another head's).
inline std::vector<int64_t> task_order(const Fwd& fwd) {
  const contract::ForwardProblem& p = fwd.p;
  const FwdPlan& plan = fwd.plan;
  const int64_t n_groups = plan.n_groups, rows = plan.group * plan.BQ;
  std::vector<int64_t> order(static_cast<size_t>(p.B * p.Hq * n_groups));
  std::vector<int64_t> groups(static_cast<size_t>(n_groups)), work(groups.size());
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t g = 0; g < n_groups; ++g) {
      work[static_cast<size_t>(g)] = fwd.work(b, g * rows, std::min(p.Lq, (g + 1) * rows));
    }
    std::iota(groups.begin(), groups.end(), int64_t{0});
    std::stable_sort(groups.begin(), groups.end(), [&](int64_t x, int64_t y) {
      return work[static_cast<size_t>(x)] > work[static_cast<size_t>(y)];
    });
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t bh = b * p.Hq + h;
      for (int64_t g = 0; g < n_groups; ++g)
        order[static_cast<size_t>(bh * n_groups + g)] =
            bh * n_groups + groups[static_cast<size_t>(g)];
    }
  }
  return order;
}

inline void forward_impl(const contract::ForwardProblem& p) {
  if (decode_forward(p)) return;  // few query rows: attention_decode-inl.h
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0) return;
  Fwd fwd(p);
  std::vector<float, AlignedAlloc<float>> row_ml;  // a per-ISA type: see AlignedAlloc
  if (p.weights.defined()) {
    row_ml.assign(static_cast<size_t>(p.B * p.Hq * p.Lq * 2), 0.0f);
    fwd.row_ml = row_ml.data();
  }
  const FwdPlan& plan = fwd.plan;
  const int64_t row_tasks = p.B * p.Hq * plan.n_groups;
  const std::vector<int64_t> order = task_order(fwd);
  // Task t -> (b, h, rows [i0, i1) of plan.group query tiles), in the order of task_order.
  auto task_rows = [&](int64_t t, int64_t* b, int64_t* h, int64_t* i0, int64_t* i1) {
    const int64_t id = order[static_cast<size_t>(t)];
    const int64_t qg = id % plan.n_groups, bh = id / plan.n_groups;
    *b = bh / p.Hq, *h = bh % p.Hq;
    *i0 = qg * plan.group * plan.BQ, *i1 = std::min(p.Lq, *i0 + plan.group * plan.BQ);
  };

  if (plan.n_chunks == 1) {
    parallel_for(row_tasks, p.threads, [&](int64_t t, int worker) {
      const TileScope tiles(fwd.pairs);  // one tile configuration per task (amx targets)
      Scratch& w = worker_scratch(plan.total);
      int64_t b, h, i0, i1;
      task_rows(t, &b, &h, &i0, &i1);
      const RowScorer rs(p, b, h);
      fwd.attend(rs, b, h, i0, i1, 0, p.Lk, w);
      fwd.write_rows(b, h, i0, i1 - i0, plan.buf.o.in(w), plan.buf.m.in(w), plan.buf.l.in(w),
                     plan.buf.row.in(w));
    });
  } else {
    // Split-KV: partial (O, m, l) per (row task, chunk); the task that finishes a row task's last
    // chunk merges them in chunk order, in the same parallel region.
    const int64_t per = plan.BQ * (plan.Dvp + 2);
    std::vector<float, AlignedAlloc<float>> part(
        static_cast<size_t>(row_tasks * plan.n_chunks * per));
    GroupCountdown chunks_left(row_tasks, plan.n_chunks);
    auto merge = [&](int64_t task, Scratch& w) {
      int64_t b, h, i0, i1;
      task_rows(task, &b, &h, &i0, &i1);
      const int64_t nr = i1 - i0, Dvp = plan.Dvp;
      float* o = plan.buf.o.in(w);
      float* m = plan.buf.m.in(w);
      float* l = plan.buf.l.in(w);
      const float* task_part = part.data() + task * plan.n_chunks * per;
      for (int64_t r = 0; r < nr; ++r)
        m[r] = merge_partials_row(task_part, plan.n_chunks, plan.BQ, Dvp, r, o + r * Dvp, l + r);
      fwd.write_rows(b, h, i0, nr, o, m, l, plan.buf.row.in(w));
    };
    parallel_for(row_tasks * plan.n_chunks, p.threads, [&](int64_t t, int worker) {
      const TileScope tiles(fwd.pairs);
      Scratch& w = worker_scratch(plan.total);
      int64_t b, h, i0, i1;
      task_rows(t / plan.n_chunks, &b, &h, &i0, &i1);
      const int64_t c = t % plan.n_chunks, nr = i1 - i0;
      const RowScorer rs(p, b, h);
      fwd.attend(rs, b, h, i0, i1, c * plan.chunk, std::min(p.Lk, (c + 1) * plan.chunk), w);
      float* dst = part.data() + t * per;
      std::copy(plan.buf.o.in(w), plan.buf.o.in(w) + nr * plan.Dvp, dst);
      std::copy(plan.buf.m.in(w), plan.buf.m.in(w) + nr, dst + plan.BQ * plan.Dvp);
      std::copy(plan.buf.l.in(w), plan.buf.l.in(w) + nr, dst + plan.BQ * (plan.Dvp + 1));
      if (chunks_left.finish(t / plan.n_chunks)) merge(t / plan.n_chunks, w);
    });
  }

  if (p.weights.defined()) {
    parallel_for(p.B * p.Hq * plan.n_qt, p.threads, [&](int64_t t, int worker) {
      const TileScope tiles(fwd.pairs);
      Scratch& w = worker_scratch(plan.total);
      const int64_t bh = t / plan.n_qt, b = bh / p.Hq, h = bh % p.Hq;
      const int64_t i0 = (t % plan.n_qt) * plan.BQ, i1 = std::min(p.Lq, i0 + plan.BQ);
      const RowScorer rs(p, b, h);
      fwd.write_weights(rs, b, h, i0, i1, w);
    });
  }
}
