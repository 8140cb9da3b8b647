// Helpers for the nn tests: random tensors and a finite-difference gradient check of a module's
// inputs and parameters in double precision.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attn/nn.h"
#include "test_util.h"

namespace attn::nn::testing {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64,
                            double lo = -1.0, double hi = 1.0) {
  test::Rng rng(seed);
  std::vector<double> v(static_cast<size_t>(checked_numel(shape, "random_tensor")));
  for (double& x : v) x = rng.uniform(lo, hi);
  return Tensor::from_vector(shape, v, dtype);
}

inline double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector()) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max(|b|_inf, tiny): the error measure of the DESIGN.md tolerances.
inline double rel_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return err / std::max(scale, 1e-30);
}

// A differentiable function of some f64 input tensors and a module's parameters.
//   forward(): the output for the current input values (deterministic: re-seed dropout inside).
//   backward(dy): the gradients of the inputs (same order), accumulating the parameter gradients.
struct GradProblem {
  std::vector<std::pair<std::string, Tensor>> inputs;  // perturbed in place
  Module* module = nullptr;  // its parameters are checked too (may be null)
  std::function<Tensor()> forward;
  std::function<std::vector<Tensor>(const Tensor& dy)> backward;
};

// loss = sum(out * w) for a fixed random w; compares d loss / d x by central differences against
// the analytic gradient on up to `per_tensor` elements of every input and parameter.
inline void gradcheck(GradProblem& p, uint64_t seed = 7, int per_tensor = 24,
                      double tol = test::kGradcheckTol) {
  const Tensor out = p.forward();
  const Tensor w = random_tensor(out.shape(), seed, DType::f64);
  if (p.module) p.module->zero_grad();
  const std::vector<Tensor> din = p.backward(w);
  ASSERT_EQ(din.size(), p.inputs.size());
  auto loss = [&]() { return dot(p.forward(), w); };
  struct Target {
    std::string name;
    Tensor value, grad;
  };
  std::vector<Target> targets;
  for (size_t i = 0; i < p.inputs.size(); ++i)
    targets.push_back({p.inputs[i].first, p.inputs[i].second, din[i]});
  if (p.module) {
    for (auto& np : p.module->named_parameters())
      targets.push_back({np.name, np.value, np.grad.clone()});
  }
  test::Rng rng(seed + 1);
  const double eps = test::kGradcheckEps;
  for (auto& t : targets) {
    ASSERT_EQ(t.value.dtype(), DType::f64) << t.name;
    ASSERT_TRUE(t.grad.defined()) << t.name;
    ASSERT_EQ(t.grad.numel(), t.value.numel()) << t.name;
    const Tensor g = t.grad.contiguous();
    const int64_t n = t.value.numel();
    double* v = t.value.data_as<double>();
    ASSERT_TRUE(t.value.is_contiguous()) << t.name;
    const double gscale = std::max(1.0, max_abs(g));
    for (int c = 0; c < std::min<int64_t>(n, per_tensor); ++c) {
      const int64_t e =
          n <= per_tensor ? c : static_cast<int64_t>(rng.next() % static_cast<uint64_t>(n));
      const double orig = v[e];
      v[e] = orig + eps;
      const double lp = loss();
      v[e] = orig - eps;
      const double lm = loss();
      v[e] = orig;
      const double numeric = (lp - lm) / (2 * eps);
      const double analytic = g.data_as<double>()[e];
      EXPECT_NEAR(analytic, numeric, tol * gscale) << t.name << " element " << e;
    }
  }
}

}  // namespace attn::nn::testing
