#include "contract/sinks.h"

#include <cmath>
#include <limits>

#include "core/parallel.h"

namespace attn::contract {

namespace {

// Element (b, h, i, j) of a 4-D view, or (b, h, i) of a 3-D one (j ignored).
char* element(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t j = 0) {
  const Shape& st = t.strides();
  int64_t offset = b * st[0] + h * st[1] + i * st[2];
  if (t.dim() > 3) offset += j * st[3];
  return static_cast<char*>(t.data()) + offset * static_cast<int64_t>(t.itemsize());
}

// Row (b, h, i) of src scaled by `factor` into dst, n elements.
void scale_row(const Tensor& src, const Tensor& dst, int64_t b, int64_t h, int64_t i, int64_t n,
               double factor) {
  for (int64_t j = 0; j < n; ++j) {
    const double x = load_as_double(element(src, b, h, i, j), src.dtype());
    // A zero weight (a removed key) stays 0 even when factor is 0 and x would make NaN: x is finite
    // here unless the row is NaN, which stays NaN.
    store_from_double(element(dst, b, h, i, j), dst.dtype(), x == 0.0 ? 0.0 : x * factor);
  }
}

}  // namespace

void fold_sinks(const ForwardProblem& p, const Tensor& out_src, const Tensor& out_dst,
                const Tensor& weights_src, const Tensor& weights_dst) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  parallel_for(p.B * p.Hq, p.threads, [&](int64_t task, int) {
    const int64_t b = task / p.Hq, h = task % p.Hq;
    const double sink = p.sinks[h];
    for (int64_t i = 0; i < p.Lq; ++i) {
      char* at = element(p.lse, b, h, i);
      const double lse = load_as_double(at, p.lse.dtype());
      // lse' = log(exp(lse) + exp(sink)) as max + log1p(exp(min - max)); a row without keys
      // (lse = -inf) gets lse' = sink and factor 0; a NaN row stays NaN.
      double folded = sink, factor = 0.0;
      if (std::isnan(lse)) {
        folded = lse, factor = lse;
      } else if (lse != kNegInf) {
        const double hi = std::max(lse, sink), lo = std::min(lse, sink);
        folded = hi + std::log1p(std::exp(lo - hi));
        factor = std::exp(lse - folded);
      }
      store_from_double(at, p.lse.dtype(), folded);
      scale_row(out_src, out_dst, b, h, i, p.Dv, factor);
      if (weights_src.defined()) scale_row(weights_src, weights_dst, b, h, i, p.Lk, factor);
    }
  });
}

std::vector<double> sink_gradient(const BackwardProblem& p) {
  std::vector<double> per_head(static_cast<size_t>(p.B * p.Hq), 0.0);
  parallel_for(p.B * p.Hq, p.threads, [&](int64_t task, int) {
    const int64_t b = task / p.Hq, h = task % p.Hq;
    double sum = 0.0;
    for (int64_t i = 0; i < p.Lq; ++i) {
      const double lse = load_as_double(element(p.lse, b, h, i), p.lse.dtype());
      double delta = 0.0;  // D_i = dO_i . out_i
      for (int64_t d = 0; d < p.Dv; ++d) {
        delta += load_as_double(element(p.dout, b, h, i, d), p.dout.dtype()) *
                 load_as_double(element(p.out, b, h, i, d), p.out.dtype());
      }
      sum -= std::exp(p.sinks[h] - lse) * delta;
    }
    per_head[task] = sum;
  });
  // Summed over the batch in a fixed order: the same bits for any thread count.
  std::vector<double> dsinks(static_cast<size_t>(p.Hq), 0.0);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) dsinks[h] += per_head[b * p.Hq + h];
  }
  return dsinks;
}

}  // namespace attn::contract
