// The blocks of a dot-form product (core/dot_form.h), written once for every operand type and
// instruction set: included inside a per-ISA namespace after its target pragma and after
// core/lane_fold-inl.h (no include guard, no headers: each namespace gets its own copy).
//
// A block of N outputs (R rows x N / R columns, N the lanes of the accumulator vector) keeps one
// whole-register accumulator per output: each step loads R vectors of x and N / R of w and feeds N
// multiply-adds; accumulator lane l sums its own share of K, the last K % kStep elements from
// zero-padded vectors. fold_lanes then sums every accumulator's lanes at once. Each output is that
// one fixed chain whatever R, the columns or the thread that computes it, so a row alone gives the
// bits it gives in a block.
//
// The operand policy Op:
//   X, Wt                      the element types of x's and w's rows
//   V                          the accumulator vector (N float lanes)
//   kStep                      elements of a row that one step reads
//   load_x(p), load_w(p)       one step's vector of a row of x / of w at p
//   load_x_part(p, n), load_w_part(p, n)   the first n < kStep elements at p, the rest zero
//   madd(acc, x, w)            acc plus the lane-wise products of one step's x and w

// The N outputs of a block of R rows x N / R columns: lane r * (N / R) + c is x row xr[r] . w row
// wr[c] over K. `ahead` (when not null): w rows prefetched into L2 at each step's offset.
template <class Op, int R>
inline typename Op::V dot_block(const typename Op::X* const* xr, const typename Op::Wt* const* wr,
                                int64_t K, const typename Op::Wt* const* ahead) {
  using V = typename Op::V;
  constexpr int N = sizeof(V) / sizeof(float), C = N / R;
  V acc[N] = {};
  const auto step = [&](auto load_x, auto load_w) {
    decltype(load_w(wr[0])) wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_w(wr[c]);
    for (int r = 0; r < R; ++r) {
      const auto xv = load_x(xr[r]);
      for (int c = 0; c < C; ++c) acc[r * C + c] = Op::madd(acc[r * C + c], xv, wv[c]);
    }
  };
  int64_t k = 0;
  for (; k + Op::kStep <= K; k += Op::kStep) {
    if (ahead != nullptr)
      for (int c = 0; c < C; ++c) __builtin_prefetch(ahead[c] + k, 0, 2);  // PREFETCHT1
    step([&](const typename Op::X* x) { return Op::load_x(x + k); },
         [&](const typename Op::Wt* w) { return Op::load_w(w + k); });
  }
  if (k < K) {  // the last K % kStep elements, zero-padded: the same multiply-adds, the same lanes
    const int64_t n = K - k;
    step([&](const typename Op::X* x) { return Op::load_x_part(x + k, n); },
         [&](const typename Op::Wt* w) { return Op::load_w_part(w + k, n); });
  }
  return fold_lanes(acc);
}

// Rows [m0, m1) x columns [n0, n1) of p.y in blocks of R rows x N / R columns. Column blocks
// outermost: a block's weight rows stay in L1 while the row blocks of x pass them, and the first
// row block prefetches the next column block's weight rows into L2 (PREFETCHT1). A model's
// weights past the L3 come from memory, and even in the L3 the next rows were late: batch 1 on a
// Zen 4, 2 threads, whole BertModel calls alternated against no prefetch 4 times each, L2 won 12
// of 12 at 16 tokens (MiniLM f32 3.9-5.0 against 5.1-6.7 ms, bf16 2.5-4.3 against 3.3-4.9,
// BERT-base bf16 16.1-16.7 against 19.1-23.1) and 9 of 12 at 1 token; into L1 (PREFETCHT0) lost
// to none where the weights fit the L3 (MiniLM bf16 at 16 tokens 4 of 4, f32 at 1 token 4 of 4,
// by 7-25%; presumably its lines evict the rows in use). Past the last row or column a block
// reads the last one again; those outputs are not stored.
template <class Op, int R>
void dot_rows(const DotForm<typename Op::X, typename Op::Wt>& p, int64_t m0, int64_t m1, int64_t n0,
              int64_t n1) {
  constexpr int C = static_cast<int>(sizeof(typename Op::V) / sizeof(float)) / R;
  for (int64_t n = n0; n < n1; n += C) {
    const typename Op::Wt* wr[C];
    const typename Op::Wt* next[C];
    for (int c = 0; c < C; ++c) {
      wr[c] = p.w + std::min(n + c, n1 - 1) * p.K;
      next[c] = p.w + std::min(n + C + c, n1 - 1) * p.K;
    }
    const int cols = static_cast<int>(std::min<int64_t>(C, n1 - n));
    for (int64_t m = m0; m < m1; m += R) {
      const typename Op::X* xr[R];
      for (int r = 0; r < R; ++r) xr[r] = p.x + std::min(m + r, m1 - 1) * p.K;
      const auto sum = dot_block<Op, R>(xr, wr, p.K, m == m0 ? next : nullptr);
      const int rows = static_cast<int>(std::min<int64_t>(R, m1 - m));
      for (int r = 0; r < rows; ++r) {
        float* y = p.y + (m + r) * p.N + n;
        for (int c = 0; c < cols; ++c) y[c] = p.b ? sum[r * C + c] + p.b[n + c] : sum[r * C + c];
      }
    }
  }
}

// Columns [n0, n1) of p.y, every row: blocks of kRows rows, the rows that do not fill one in blocks
// of 1 row x N columns (each w vector then feeds one multiply-add: more loads, none spent on a
// padded row).
template <class Op, int kRows>
void dot_columns(const DotForm<typename Op::X, typename Op::Wt>& p, int64_t n0, int64_t n1) {
  const int64_t whole = p.M / kRows * kRows;
  dot_rows<Op, kRows>(p, 0, whole, n0, n1);
  if constexpr (kRows > 1) {
    if (whole < p.M) dot_rows<Op, 1>(p, whole, p.M, n0, n1);
  }
}
