// Shared test helpers (header-only, so that every tests/<area>/ program can include it):
//   - tolerances by dtype (DESIGN.md "Testing"),
//   - seeded random tensors of any dtype, contiguous or laid out awkwardly (padded rows, transposed
//   storage,
//     non-unit last stride, broadcast with stride 0),
//   - error metrics (max abs error relative to the reference's max magnitude),
//   - a finite-difference gradient checker in double for any scalar function of tensors.
// The independent naive attention lives in naive_attention.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::test {

// ---- Tolerances: bounds on rel_error() below.
// ------------------------------------------------------------ f64 against an independent f64
// implementation: summation order differs, nothing else.
inline constexpr double kTolF64 = 1e-12;
// f32 computation against double (DESIGN.md): forward and gradients.
inline constexpr double kTolF32Forward = 1e-6;
inline constexpr double kTolF32Grad = 1e-5;
// Unit roundoff of each dtype: a result computed exactly and then stored in that dtype is within u
// * |x|.
inline constexpr double kUnitRoundoffF32 = 0x1p-24;
inline constexpr double kUnitRoundoffBF16 = 0x1p-8;
inline constexpr double kUnitRoundoffF16 = 0x1p-11;
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64:
      return 0x1p-53;
    case DType::f32:
      return kUnitRoundoffF32;
    case DType::bf16:
      return kUnitRoundoffBF16;
    case DType::f16:
      return kUnitRoundoffF16;
    default:
      return 0.0;
  }
}
// Central differences with kGradcheckEps in double: truncation ~eps^2 and cancellation ~1e-16 / eps
// leave about 1e-9 relative; a wrong backward is off by far more than this.
inline constexpr double kGradcheckEps = 1e-6;
inline constexpr double kGradcheckTol = 1e-6;

// ---- Seeded random numbers: SplitMix64, identical on every platform and standard library.
// ---------------
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t integer(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool bernoulli(double p_true) { return uniform() < p_true; }

 private:
  uint64_t state_;
};

// How a test tensor sits in memory. Every layout holds the same values for the same seed.
enum class Layout {
  contiguous,
  padded,      // rows of the last dim padded: stride(-2) > size(-1) (last dim unit-stride)
  transposed,  // the last two dims before the last swapped in storage ([..., L, H, D] viewed as
               // [..., H, L, D])
  strided,     // last dim stride 2 (the fast path must copy)
};
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous:
      return "contiguous";
    case Layout::padded:
      return "padded";
    case Layout::transposed:
      return "transposed";
    case Layout::strided:
      return "strided";
  }
  return "?";
}

// A tensor of `dtype` and `shape` holding the contiguous `values` (row-major) in the given layout.
inline Tensor with_layout(const Tensor& contiguous_values, Layout layout) {
  const Tensor& c = contiguous_values;
  const Shape& shape = c.shape();
  const int n = c.dim();
  switch (layout) {
    case Layout::contiguous:
      return c.clone();
    case Layout::padded: {
      if (n == 0) return c.clone();
      Shape big = shape;
      big[n - 1] += 3;
      Tensor storage = Tensor::full(big, std::numeric_limits<double>::quiet_NaN(), c.dtype());
      Tensor view = storage.slice(n - 1, 1, 1 + shape[n - 1]);
      view.copy_from(c);
      return view;
    }
    case Layout::transposed: {
      if (n < 3) return with_layout(c, Layout::padded);
      Tensor storage = Tensor::empty(c.transpose(n - 3, n - 2).shape(), c.dtype());
      Tensor view = storage.transpose(n - 3, n - 2);
      view.copy_from(c);
      return view;
    }
    case Layout::strided: {
      if (n == 0) return c.clone();
      Shape big = shape;
      big[n - 1] *= 2;
      Tensor storage = Tensor::full(big, std::numeric_limits<double>::quiet_NaN(), c.dtype());
      Tensor view = storage.slice(n - 1, 0, 2 * shape[n - 1], 2);
      view.copy_from(c);
      return view;
    }
  }
  return c.clone();
}

// Uniform values in [lo, hi), rounded to `dtype`, from `seed`; the values do not depend on the
// layout.
inline Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1.0,
                            double hi = 1.0, Layout layout = Layout::contiguous) {
  Rng rng(seed);
  std::vector<double> values(
      static_cast<size_t>(checked_numel(shape, "attn::test::random_tensor")));
  for (double& x : values) x = rng.uniform(lo, hi);
  return with_layout(Tensor::from_vector(shape, values, dtype), layout);
}

// Booleans, true with probability p_true.
inline Tensor random_bool(const Shape& shape, double p_true, uint64_t seed,
                          Layout layout = Layout::contiguous) {
  Rng rng(seed);
  std::vector<double> values(static_cast<size_t>(checked_numel(shape, "attn::test::random_bool")));
  for (double& x : values) x = rng.bernoulli(p_true) ? 1.0 : 0.0;
  return with_layout(Tensor::from_vector(shape, values, DType::boolean), layout);
}

inline Tensor to_f64(const Tensor& t) {
  return t.to(DType::f64);
}

// ---- Error metrics.
// ---------------------------------------------------------------------------------- max_i
// |actual_i - expected_i| over elements; equal infinities count as 0, a NaN on either side that the
// other side does not share as +inf. Shapes must match.
inline double max_abs_error(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape()) return std::numeric_limits<double>::infinity();
  const std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(e[i])) {
      if (!(std::isnan(a[i]) && std::isnan(e[i]))) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (a[i] == e[i]) continue;  // also equal infinities
    worst = std::max(worst, std::abs(a[i] - e[i]));
  }
  return worst;
}

// max |expected| over finite elements (0 when there are none).
inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double x : t.to_vector()) {
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  }
  return m;
}

// The metric every tolerance above bounds: max abs error / max |expected| (max abs error alone when
// the expected tensor is all zeros). Relative to the tensor's scale, not per element, so that tiny
// entries (exponentially small weights) do not dominate.
inline double rel_error(const Tensor& actual, const Tensor& expected) {
  const double err = max_abs_error(actual, expected);
  const double scale = max_abs(expected);
  return scale > 0.0 ? err / scale : err;
}

inline bool all_finite(const Tensor& t) {
  for (double x : t.to_vector()) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}
inline bool all_equal(const Tensor& t, double value) {
  for (double x : t.to_vector()) {
    if (!(x == value)) return false;
  }
  return true;
}
// Bitwise-equal contents (same dtype and shape).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const auto* pa = static_cast<const unsigned char*>(ca.data());
  const auto* pb = static_cast<const unsigned char*>(cb.data());
  return std::equal(pa, pa + ca.numel() * static_cast<int64_t>(ca.itemsize()), pb);
}

// ---- Finite-difference gradient check.
// -------------------------------------------------------------- f maps inputs (contiguous f64
// tensors, in the order given) to a scalar. For input n, grads[n] is the analytic dL/d(input n)
// (any dtype, same shape; an undefined tensor skips that input). Each checked element x is
// perturbed in place: numeric = (f(x + eps) - f(x - eps)) / (2 eps). Elements checked: all of them
// when max_checks_per_input < 0 or the input is that small, else max_checks_per_input elements
// drawn at random (with `seed`). Elements that are +-inf (e.g. an add mask's removed keys) are
// skipped.
struct GradcheckReport {
  double max_abs_error = 0.0;  // over every checked element of every input
  double max_abs_grad = 0.0;   // max |analytic| over every checked element
  int64_t checked = 0;
  std::string worst;  // "input n, element e: analytic a, numeric b"
  double relative() const {
    return max_abs_grad > 0.0 ? max_abs_error / max_abs_grad : max_abs_error;
  }
};

inline GradcheckReport gradcheck(const std::function<double(const std::vector<Tensor>&)>& f,
                                 const std::vector<Tensor>& inputs_in,
                                 const std::vector<Tensor>& grads, double eps = kGradcheckEps,
                                 int64_t max_checks_per_input = -1, uint64_t seed = 1) {
  std::vector<Tensor> inputs;
  for (const Tensor& t : inputs_in) inputs.push_back(t.to(DType::f64));
  GradcheckReport report;
  Rng rng(seed);
  for (size_t n = 0; n < inputs.size() && n < grads.size(); ++n) {
    if (!grads[n].defined()) continue;
    const std::vector<double> analytic = grads[n].to_vector();
    double* x = inputs[n].data_as<double>();
    const int64_t count = inputs[n].numel();
    std::vector<int64_t> elements;
    if (max_checks_per_input < 0 || count <= max_checks_per_input) {
      for (int64_t e = 0; e < count; ++e) elements.push_back(e);
    } else {
      for (int64_t c = 0; c < max_checks_per_input; ++c)
        elements.push_back(rng.integer(0, count - 1));
    }
    for (int64_t e : elements) {
      const double saved = x[e];
      if (!std::isfinite(saved)) continue;
      x[e] = saved + eps;
      const double plus = f(inputs);
      x[e] = saved - eps;
      const double minus = f(inputs);
      x[e] = saved;
      const double numeric = (plus - minus) / (2.0 * eps);
      const double err = std::isfinite(numeric) ? std::abs(numeric - analytic[e])
                                                : std::numeric_limits<double>::infinity();
      report.max_abs_grad = std::max(report.max_abs_grad, std::abs(analytic[e]));
      if (!(err <= report.max_abs_error)) {
        report.max_abs_error = err;
        report.worst = "input " + std::to_string(n) + ", element " + std::to_string(e) +
                       ": analytic " + std::to_string(analytic[e]) + ", numeric " +
                       std::to_string(numeric);
      }
      ++report.checked;
    }
  }
  return report;
}

// sum_i a_i * b_i over all elements (same shape), in double: the loss L = <G, out> whose gradient
// is G.
inline double dot_all(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double s = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) s += x[i] * y[i];
  return s;
}

}  // namespace attn::test
