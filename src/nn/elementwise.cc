// Dispatch and threading of attn::nn's element-wise kernels (see elementwise.h): the instruction set
// is core/isa.h's choice, at its plain-vector width; work is cut into fixed-size chunks handed to
// parallel_for, so the result is the same for any thread count.
#include "nn/elementwise.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/dot_form.h"
#include "core/parallel.h"
#include "nn/ops.h"

namespace attn::nn::ew {

namespace {

constexpr int64_t kChunk = 16384;  // floats per task of the element-wise maps

const Kernels& kernels_for(cpu::Isa isa) {
#if defined(__x86_64__)
  if (isa == cpu::Isa::avx512) return avx512::kernels;
  if (isa == cpu::Isa::avx2) return avx2::kernels;
#endif
  (void)isa;
  return portable::kernels;
}

// `rows` zeroed rows of at least `cols` values, each starting a cache line of its own: rows that
// two workers write at once (their scratch, each chunk's partial sums) must not share a line, which
// then moves between their cores on every write (two threads ran a LayerNorm no faster than one).
// rows = 0 or cols = 0: no rows.
template <class T>
class LineRows {
 public:
  LineRows(int64_t rows, int64_t cols)
      : stride_(rows > 0 && cols > 0 ? (cols * sizeof(T) + 63) / 64 * 64 / sizeof(T) : 0),
        buf_(static_cast<size_t>(rows * stride_ + (stride_ > 0 ? 64 / sizeof(T) : 0)), T{}) {
    const auto a = reinterpret_cast<uintptr_t>(buf_.data());
    base_ = reinterpret_cast<T*>((a + 63) / 64 * 64);
  }
  T* operator[](int64_t r) { return base_ + r * stride_; }

 private:
  int64_t stride_;
  std::vector<T> buf_;
  T* base_;
};

// One thread below two chunks of work (a team costs more than it saves there), else attn's count.
int threads_for(int64_t elements) {
  return elements < 2 * kChunk ? 1 : 0;
}

// fn(i, len) over [0, n) in chunks of kChunk elements, one task each.
template <class F>
void for_chunks(int64_t n, F fn) {
  parallel_for((n + kChunk - 1) / kChunk, threads_for(n), [&](int64_t t, int) {
    const int64_t i = t * kChunk;
    fn(i, std::min(kChunk, n - i));
  });
}

// fn(r) for every row of `cols` elements, whole rows per task (about kChunk elements each).
template <class F>
void for_rows(int64_t rows, int64_t cols, F fn) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t per = std::max<int64_t>(1, kChunk / cols);
  parallel_for((rows + per - 1) / per, threads_for(rows * cols), [&](int64_t t, int) {
    for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) fn(r);
  });
}

}  // namespace

const Kernels& active_kernels() {
  return kernels_for(active_isa());
}

cpu::Isa active_isa() {
  return cpu::vector_isa(cpu::active_isa());
}

void act_forward(Activation a, const float* x, float* y, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.act_forward(a, x + i, y + i, len); });
}

void act_backward(Activation a, const float* x, const float* dy, float* dx, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.act_backward(a, x + i, dy + i, dx + i, len); });
}

void act_forward_bf16(Activation a, const uint16_t* x, uint16_t* y, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.act_forward_bf16(a, x + i, y + i, len); });
}

void bias_act_forward(Activation a, float* h, const float* b, float* y, int64_t rows,
                      int64_t cols) {
  const Kernels& k = active_kernels();
  for_rows(rows, cols, [&](int64_t r) { k.bias_act_row(a, h + r * cols, b, y + r * cols, cols); });
}

void bias_act_round_bf16(Activation a, float* h, const float* b, int64_t rows, int64_t cols) {
  const Kernels& k = active_kernels();
  for_rows(rows, cols, [&](int64_t r) { k.bias_act_round_bf16_row(a, h + r * cols, b, cols); });
}

void bias_act_forward_bf16(Activation a, float* h, const float* b, uint16_t* out, int64_t rows,
                           int64_t cols) {
  const Kernels& k = active_kernels();
  for_rows(rows, cols,
           [&](int64_t r) { k.bias_act_bf16_row(a, h + r * cols, b, out + r * cols, cols); });
}

namespace {
// row(r, part) for every row, in fixed chunks of rows on attn's threads; part is the chunk's own
// [cols] partial column sums (null when db is), added to db in chunk order afterwards (in double):
// the same bits for any thread count.
template <class Row>
void rows_with_column_sums(int64_t rows, int64_t cols, float* db, Row&& row) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t per = std::max<int64_t>(1, 2 * kChunk / cols);
  const int64_t tasks = (rows + per - 1) / per;
  LineRows<float> part(db ? tasks : 0, cols);  // each chunk's sums, written on every row
  const int threads = std::min<int64_t>(resolve_threads(threads_for(rows * cols)), tasks);
  parallel_for(tasks, threads, [&](int64_t t, int) {
    float* pd = db ? part[t] : nullptr;
    for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) row(r, pd);
  });
  if (!db) return;
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0;
    for (int64_t t = 0; t < tasks; ++t) s += part[t][c];
    db[c] = static_cast<float>(db[c] + s);
  }
}
}  // namespace

void act_backward_bf16(Activation a, const float* x, const uint16_t* dy, uint16_t* dx, float* db,
                       int64_t rows, int64_t cols) {
  const Kernels& k = active_kernels();
  rows_with_column_sums(rows, cols, db, [&](int64_t r, float* part) {
    k.act_backward_bf16_row(a, x + r * cols, dy + r * cols, dx + r * cols, part, cols);
  });
}

void column_sums_bf16(const uint16_t* y, int64_t rows, int64_t cols, float* db) {
  const Kernels& k = active_kernels();
  rows_with_column_sums(rows, cols, db,
                        [&](int64_t r, float* part) { k.add_bf16_row(y + r * cols, part, cols); });
}

void linear_dot(const DotLinear& p) {
  const Kernels& k = active_kernels();
  parallel_dot_columns(p.M, p.N, p.K,
                       [&](int64_t n0, int64_t n1) { k.linear_dot_cols(p, n0, n1); });
}

bool linear_dot_route(int64_t M) {
  return M <= kDotLinearRows && active_isa() != cpu::Isa::portable;
}

void erf(const float* x, float* y, int64_t n) {
  active_kernels().erf(x, y, n);
}

void dropout_f32(const DropoutDraw& d, const float* x, float* y, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.dropout_f32(d, x + i, y + i, i, len); });
}

void dropout_bf16(const DropoutDraw& d, const uint16_t* x, uint16_t* y, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.dropout_bf16(d, x + i, y + i, i, len); });
}

void widen_bf16(const uint16_t* src, float* dst, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.widen_bf16(src + i, dst + i, len); });
}

void round_bf16(const float* src, uint16_t* dst, int64_t n) {
  const Kernels& k = active_kernels();
  for_chunks(n, [&](int64_t i, int64_t len) { k.round_bf16(src + i, dst + i, len); });
}

void bias_round_bf16(const float* y, const float* b, uint16_t* out, int64_t rows, int64_t cols) {
  const Kernels& k = active_kernels();
  for_rows(rows, cols,
           [&](int64_t r) { k.bias_round_bf16_row(y + r * cols, b, out + r * cols, cols); });
}

void layer_norm_forward(const LayerNormForward& p) {
  if (p.rows <= 0 || p.d <= 0) return;
  const Kernels& k = active_kernels();
  const int64_t per = std::max<int64_t>(1, kChunk / p.d);
  const int64_t tasks = (p.rows + per - 1) / per;
  const int threads = std::min<int64_t>(resolve_threads(threads_for(p.rows * p.d)), tasks);
  const bool staged = p.x16 != nullptr || p.r16 != nullptr || p.y16 != nullptr;
  LineRows<float> stage(staged ? threads : 0, p.d);
  LineRows<double> rows_d(threads, p.d);
  parallel_for(tasks, threads, [&](int64_t t, int worker) {
    float* own = staged ? stage[worker] : nullptr;
    k.layer_norm_forward(p, t * per, std::min(p.rows, (t + 1) * per), own, rows_d[worker]);
  });
}

void layer_norm_backward(const LayerNormBackward& p) {
  if (p.rows <= 0 || p.d <= 0) return;
  const Kernels& k = active_kernels();
  // Chunks of fixed size (2x the forward's: fewer partial rows to add), each with its own partial
  // dw / db, summed in chunk order afterwards.
  const int64_t per = std::max<int64_t>(1, 2 * kChunk / p.d);
  const int64_t tasks = (p.rows + per - 1) / per;
  const bool params = p.dw != nullptr || p.db != nullptr;
  // Chunk t's partial dw in row 2 t, db in row 2 t + 1.
  LineRows<float> part(params ? 2 * tasks : 0, p.d);
  const int threads = std::min<int64_t>(resolve_threads(threads_for(p.rows * p.d)), tasks);
  const bool staged = p.x16 != nullptr || p.r16 != nullptr;
  LineRows<float> stage(staged ? threads : 0, 2 * p.d);
  parallel_for(tasks, threads, [&](int64_t t, int worker) {
    float* dw = p.dw ? part[2 * t] : nullptr;
    float* db = p.db ? part[2 * t + 1] : nullptr;
    float* own = staged ? stage[worker] : nullptr;
    k.layer_norm_backward(p, t * per, std::min(p.rows, (t + 1) * per), dw, db, own);
  });
  if (!params) return;
  for (int64_t i = 0; i < p.d; ++i) {
    double sw = 0, sb = 0;
    for (int64_t t = 0; t < tasks; ++t) {
      sw += part[2 * t][i];
      sb += part[2 * t + 1][i];
    }
    if (p.dw) p.dw[i] = static_cast<float>(p.dw[i] + sw);
    if (p.db) p.db[i] = static_cast<float>(p.db[i] + sb);
  }
}

}  // namespace attn::nn::ew
