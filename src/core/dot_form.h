// Products of few rows in dot-product form, y [M, N] = x [M, K] w [N, K]^T (+ b [N]), all
// row-major and contiguous, w read where it is (a Linear's weight): the problem as the per-ISA
// blocks of dot_form-inl.h take it, and the one rule that spreads its columns over attn's threads.
// Users: nn's f32 product (nn/elementwise_dot_linear-inl.h, f32 or bf16 weights) and the cpu
// backend's VDPBF16PS product (backends/cpu/dot_linear_bf16-inl.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/parallel.h"

namespace attn {

// X, Wt: the element types of x's and w's rows (float, or bf16 bit patterns as uint16_t).
template <class X, class Wt>
struct DotForm {
  const X* x;
  const Wt* w;
  const float* b;  // nullptr: no bias
  float* y;
  int64_t M, N, K;
};

// Runs cols(n0, n1) over chunks of the N columns of a dot-form product on attn's threads: one
// thread below ~1M multiply-adds, counting each weight as at least 4 (with few rows the weights'
// reads are the work); else about four chunks per thread, of whole blocks of 16 columns. Which
// columns a chunk gets changes no bit (each output is one fixed chain).
template <class Cols>
void parallel_dot_columns(int64_t M, int64_t N, int64_t K, Cols&& cols) {
  if (M <= 0 || N <= 0) return;
  constexpr int64_t kMinWork = int64_t{1} << 20, kBlockCols = 16;
  const int threads = resolve_threads(std::max<int64_t>(M, 4) * N * K < kMinWork ? 1 : 0);
  const int64_t want = std::max(kBlockCols, (N + 4 * threads - 1) / (4 * threads));
  const int64_t per = (want + kBlockCols - 1) / kBlockCols * kBlockCols;
  parallel_for((N + per - 1) / per, threads,
               [&](int64_t t, int) { cols(t * per, std::min(N, (t + 1) * per)); });
}

}  // namespace attn
