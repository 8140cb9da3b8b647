// Loss, optimizers, clipping, schedule, state dicts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;

TEST(CrossEntropy, ValueGradientIgnoreAndSmoothing) {
  const Tensor logits =
      Tensor::from_vector({3, 4}, {1, 2, 3, 4, 0, 0, 0, 0, -1, 5, 2, 0.5}, DType::f64);
  const Tensor targets = Tensor::from_vector({3}, {3, -100, 1}, DType::i64);
  const double eps = 0.1;
  const CrossEntropyResult r = cross_entropy(logits, targets, -100, eps);
  EXPECT_EQ(r.count, 2);
  // Direct formula over the two counted rows.
  double expect = 0;
  for (int64_t n : {0, 2}) {
    double lse = 0;
    for (int64_t c = 0; c < 4; ++c) lse += std::exp(logits.at({n, c}));
    lse = std::log(lse);
    const int64_t t = static_cast<int64_t>(targets.at({n}));
    double smooth = 0;
    for (int64_t c = 0; c < 4; ++c) smooth += lse - logits.at({n, c});
    expect += (1 - eps) * (lse - logits.at({n, t})) + eps / 4 * smooth;
  }
  EXPECT_NEAR(r.loss, expect / 2, 1e-14);
  // The ignored row has zero gradient; the gradient matches finite differences.
  for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(r.dlogits.at({1, c}), 0.0);
  Tensor x = logits.clone();
  for (int64_t e = 0; e < 12; ++e) {
    double* v = x.data_as<double>();
    const double o = v[e];
    v[e] = o + 1e-6;
    const double lp = cross_entropy(x, targets, -100, eps).loss;
    v[e] = o - 1e-6;
    const double lm = cross_entropy(x, targets, -100, eps).loss;
    v[e] = o;
    EXPECT_NEAR(r.dlogits.data_as<double>()[e], (lp - lm) / 2e-6, 1e-8);
  }
  EXPECT_THROW(cross_entropy(logits, Tensor::from_vector({3}, {0, 4, 1}, DType::i64)), Error);
  EXPECT_EQ(cross_entropy(logits, Tensor::full({3}, -100, DType::i64)).loss, 0.0);
}

// A module with one parameter, for optimizer arithmetic.
class One : public Module {
 public:
  explicit One(double v) : p(register_parameter("p", Tensor::full({1}, v, DType::f64))) {}
  Parameter& p;
};

// A -inf logit (a masked vocabulary entry) is a class of probability 0: the loss stays finite unless
// the target or the smoothing's uniform share needs it (then +inf, as torch), never NaN.
TEST(CrossEntropy, MinusInfinityLogits) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor t0 = Tensor::from_vector({1}, {0}, DType::i64);
  const Tensor masked = Tensor::from_vector({1, 3}, {0, -inf, 1}, DType::f64);
  const CrossEntropyResult r = cross_entropy(masked, t0, -100, 0.0);
  EXPECT_NEAR(r.loss, std::log(1 + std::exp(1.0)), 1e-15);
  EXPECT_EQ(r.dlogits.at({0, 1}), 0.0);
  EXPECT_EQ(
      cross_entropy(Tensor::from_vector({1, 3}, {-inf, 0, 1}, DType::f64), t0, -100, 0.0).loss,
      inf);
  EXPECT_EQ(cross_entropy(masked, t0, -100, 0.1).loss, inf);
  EXPECT_EQ(cross_entropy(masked, t0, -100, 1.0).loss, inf);
}

TEST(Optim, AdamWMatchesHandComputedSteps) {
  One m(1.0);
  AdamW opt(m.named_parameters(), 0.1, 0.9, 0.999, 1e-8, 0.01);
  double w = 1.0, mo = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    const double g = 0.5 * t;
    m.p.grad.fill(g);
    opt.step();
    mo = 0.9 * mo + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    w = w * (1 - 0.1 * 0.01) -
        0.1 * (mo / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    EXPECT_NEAR(m.p.value.at({0}), w, 1e-14) << "step " << t;
  }
}

TEST(Optim, SgdMomentumMatchesPyTorchRule) {
  One m(2.0);
  SGD opt(m.named_parameters(), 0.5, 0.9);
  m.p.grad.fill(1.0);
  opt.step();  // buf = 1, w = 2 - 0.5
  EXPECT_DOUBLE_EQ(m.p.value.at({0}), 1.5);
  opt.step();  // buf = 0.9 + 1 = 1.9, w = 1.5 - 0.95
  EXPECT_DOUBLE_EQ(m.p.value.at({0}), 0.55);
  opt.zero_grad();
  EXPECT_EQ(m.p.grad.at({0}), 0.0);
}

// Resuming from a saved optimizer state continues exactly as if training had not stopped.
TEST(Optim, StateDictResumesExactly) {
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "AdamW" : "SGD momentum");
    One a(1.0), b(1.0);
    auto make = [&](One& m) -> std::unique_ptr<Optimizer> {
      if (kind == 0) return std::make_unique<AdamW>(m.named_parameters(), 0.1);
      return std::make_unique<SGD>(m.named_parameters(), 0.1, 0.9);
    };
    auto oa = make(a);
    for (int t = 1; t <= 3; ++t) {
      a.p.grad.fill(0.3 * t);
      oa->step();
    }
    // b resumes from a's parameters and optimizer state.
    b.load_state_dict(a.state_dict());
    auto ob = make(b);
    TensorList state;
    for (auto& [name, t] : oa->state_dict()) state.emplace_back(name, t.clone());
    ob->load_state_dict(state);
    for (int t = 4; t <= 6; ++t) {
      a.p.grad.fill(0.3 * t);
      b.p.grad.fill(0.3 * t);
      oa->step();
      ob->step();
      EXPECT_EQ(a.p.value.at({0}), b.p.value.at({0})) << "step " << t;
    }
    // A fresh optimizer (no state) diverges: the state matters.
    One c(a.p.value.at({0}));
    auto oc = make(c);
    c.p.grad.fill(0.3);
    a.p.grad.fill(0.3);
    oc->step();
    oa->step();
    EXPECT_NE(a.p.value.at({0}), c.p.value.at({0}));
    state.back().first += ".renamed";  // a missing name is refused
    EXPECT_THROW(make(c)->load_state_dict(state), Error);
  }
}

TEST(Optim, ClipByGlobalNorm) {
  One a(0), b(0);
  a.p.grad.fill(3.0);
  b.p.grad.fill(4.0);
  std::vector<NamedParameter> ps = a.named_parameters();
  ps.push_back(b.named_parameters()[0]);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 10.0), 5.0);
  EXPECT_EQ(a.p.grad.at({0}), 3.0);  // below the limit: untouched
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0), 5.0);
  EXPECT_NEAR(grad_norm(ps), 1.0, 1e-6);
  EXPECT_NEAR(a.p.grad.at({0}) / b.p.grad.at({0}), 0.75, 1e-15);
}

TEST(Schedule, WarmupThenCosine) {
  WarmupCosine s{.base_lr = 1.0, .warmup_steps = 4, .total_steps = 14, .min_lr = 0.1};
  EXPECT_DOUBLE_EQ(s(0), 0.25);
  EXPECT_DOUBLE_EQ(s(3), 1.0);
  EXPECT_DOUBLE_EQ(s(4), 1.0);
  EXPECT_NEAR(s(9), 0.55, 1e-15);  // half-way: min + (base - min) / 2
  EXPECT_DOUBLE_EQ(s(14), 0.1);
  EXPECT_DOUBLE_EQ(s(100), 0.1);
  for (int64_t t = 4; t < 14; ++t) EXPECT_GE(s(t), s(t + 1));
}

TEST(StateDict, LoadChecksNamesAndShapes) {
  FeedForward a(4, 8), b(4, 8);
  b.load_state_dict(a.state_dict());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a.named_parameters()[i].value.to_vector(), b.named_parameters()[i].value.to_vector());
  }
  TensorList missing = a.state_dict();
  missing.pop_back();
  EXPECT_THROW(b.load_state_dict(missing), Error);
  b.load_state_dict(missing, /*strict=*/false);
  TensorList extra = a.state_dict();
  extra.emplace_back("linear3.weight", Tensor::zeros({1}, DType::f32));
  EXPECT_THROW(b.load_state_dict(extra), Error);
  TensorList wrong = a.state_dict();
  wrong[0].second = Tensor::zeros({8, 5}, DType::f32);
  try {
    b.load_state_dict(wrong);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear1.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attn::nn
