// Building blocks: values against direct formulas, finite-difference gradients in double, errors.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::gradcheck;
using testing::GradProblem;
using testing::random_tensor;
using testing::rel_error;

TEST(Linear, MatchesDirectFormula) {
  Linear lin(5, 3, true, DType::f64);
  const Tensor x = random_tensor({2, 4, 5}, 1);
  const Tensor y = lin.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
  const Tensor& w = lin.weight().value;
  const Tensor& b = lin.bias()->value;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t o = 0; o < 3; ++o) {
        double s = b.at({o});
        for (int64_t k = 0; k < 5; ++k) s += x.at({i, l, k}) * w.at({o, k});
        EXPECT_NEAR(y.at({i, l, o}), s, 1e-14);
      }
}

TEST(Linear, F32MatchesF64) {
  manual_seed(3);
  Linear l64(33, 17, true, DType::f64);
  Linear l32(33, 17, true, DType::f32);
  l32.load_state_dict(l64.state_dict());
  const Tensor x = random_tensor({9, 33}, 2);
  const Tensor y64 = l64.forward(x);
  const Tensor y32 = l32.forward(x.to(DType::f32));
  EXPECT_EQ(y32.dtype(), DType::f32);
  EXPECT_LT(rel_error(y32, y64), 1e-6);
  const Tensor dy = random_tensor({9, 17}, 4);
  const Tensor dx64 = l64.backward(dy);
  const Tensor dx32 = l32.backward(dy.to(DType::f32));
  EXPECT_LT(rel_error(dx32, dx64), 1e-5);
  EXPECT_LT(rel_error(l32.weight().grad, l64.weight().grad), 1e-5);
}

TEST(Linear, Gradcheck) {
  for (bool bias : {true, false}) {
    Linear lin(6, 4, bias, DType::f64);
    GradProblem p;
    p.inputs = {{"x", random_tensor({3, 2, 6}, 5)}};
    p.module = &lin;
    p.forward = [&] { return lin.forward(p.inputs[0].second); };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{lin.backward(dy)}; };
    gradcheck(p);
    EXPECT_EQ(lin.named_parameters().size(), bias ? 2u : 1u);
  }
}

TEST(Linear, RejectsWrongWidth) {
  Linear lin(6, 4);
  try {
    lin.forward(Tensor::zeros({2, 5}, DType::f32));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("attn::nn::Linear::forward", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
}

// No input features (torch.nn.Linear(0, n)): every row is the bias, and dbias sums dy over the rows.
// The rows of x [2, 3, 0] were taken as numel / in = 0 before, and the view to [2, 3, 4] failed.
TEST(Linear, NoInputFeaturesGivesTheBias) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    Linear lin(0, 4, true, dt);
    lin.bias()->value.copy_from(Tensor::from_vector({4}, {1, -2, 3, 0.5}, dt));
    const Tensor y = lin.forward(Tensor::zeros({2, 3, 0}, dt));
    ASSERT_EQ(y.shape(), (Shape{2, 3, 4})) << dtype_name(dt);
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_EQ(y.view({6, 4}).at({r, c}), lin.bias()->value.at({c})) << dtype_name(dt);
    if (dt == DType::bf16) continue;  // bf16 modules are inference only
    const Tensor dx = lin.backward(Tensor::full({2, 3, 4}, 1.0, dt));
    EXPECT_EQ(dx.shape(), (Shape{2, 3, 0}));
    EXPECT_EQ(lin.bias()->grad.to_vector(), (std::vector<double>{6, 6, 6, 6}));
  }
}

TEST(LayerNorm, NormalisesAndGradchecks) {
  LayerNorm ln(7, 1e-5, true, true, DType::f64);
  // Non-trivial affine parameters so that their gradients are exercised.
  ln.load_state_dict(
      {{"weight", random_tensor({7}, 8, DType::f64, 0.5, 1.5)}, {"bias", random_tensor({7}, 9)}});
  LayerNorm plain(7, 1e-5, false, true, DType::f64);
  const Tensor x = random_tensor({4, 7}, 10, DType::f64, -3, 5);
  const Tensor y = plain.forward(x);
  for (int64_t r = 0; r < 4; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < 7; ++i) m += y.at({r, i}) / 7;
    for (int64_t i = 0; i < 7; ++i) v += (y.at({r, i}) - m) * (y.at({r, i}) - m) / 7;
    EXPECT_NEAR(m, 0.0, 1e-12);
    EXPECT_NEAR(v, 1.0, 1e-4);  // var / (var + eps)
  }
  GradProblem p;
  p.inputs = {{"x", x.clone()}};
  p.module = &ln;
  p.forward = [&] { return ln.forward(p.inputs[0].second); };
  p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{ln.backward(dy)}; };
  gradcheck(p);
}

// SkipInit: modules built under it keep zero parameters and leave the global generator where it
// was (the next module drawn equals one drawn with no SkipInit before it); it ends with its scope.
TEST(SkipInit, LeavesParametersZeroAndTheGeneratorUntouched) {
  manual_seed(5);
  const Linear drawn(6, 4);
  manual_seed(5);
  {
    const SkipInit skip;
    const Linear skipped(6, 4);
    const Embedding table(10, 3);
    for (const auto& p : skipped.named_parameters())
      for (double v : p.value.to_vector()) ASSERT_EQ(v, 0.0) << p.name;
    for (double v : table.named_parameters()[0].value.to_vector()) ASSERT_EQ(v, 0.0);
  }
  const Linear after(6, 4);  // drawn as if the skipped modules had never been built
  const auto a = after.named_parameters(), d = drawn.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].value.to_vector(), d[i].value.to_vector());
  double sum = 0;
  for (double v : a[0].value.to_vector()) sum += v * v;
  EXPECT_GT(sum, 0.0);
}

TEST(LayerNorm, WithoutBiasHasOnlyWeight) {
  // PyTorch's LayerNorm(bias=False): state {weight}, y = xhat * weight.
  LayerNorm ln(6, 1e-5, true, /*bias=*/false, DType::f64);
  std::vector<std::string> names;
  for (auto& p : ln.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names, std::vector<std::string>{"weight"});
  ln.load_state_dict({{"weight", random_tensor({6}, 18, DType::f64, 0.5, 1.5)}});
  LayerNorm plain(6, 1e-5, false, true, DType::f64);
  const Tensor x = random_tensor({3, 6}, 19, DType::f64, -2, 4);
  const Tensor y = ln.forward(x), h = plain.forward(x);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < 6; ++i)
      EXPECT_NEAR(y.at({r, i}), h.at({r, i}) * ln.named_parameters()[0].value.at({i}), 1e-14);
  GradProblem p;
  p.inputs = {{"x", x.clone()}};
  p.module = &ln;
  p.forward = [&] { return ln.forward(p.inputs[0].second); };
  p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{ln.backward(dy)}; };
  gradcheck(p);
}

TEST(Activations, SiluMatchesDoubleFormulaAndFiniteDifferences) {
  // silu(x) = x / (1 + e^-x), in f64 and f32, over a range that reaches exp's overflow on both
  // sides.
  SiLU s;
  EXPECT_EQ(parse_activation("silu"), Activation::silu);
  EXPECT_STREQ(activation_name(Activation::silu), "silu");
  const std::vector<double> xs = {-800.0, -40.0, -3.5, -1.0, -1e-3, 0.0,
                                  1e-3,   0.5,   2.0,  30.0, 800.0};
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = Tensor::from_vector({static_cast<int64_t>(xs.size())}, xs, dt);
    const std::vector<double> y = s.forward(x).to_vector();
    const std::vector<double> dx = s.backward(Tensor::full(x.shape(), 1.0, dt)).to_vector();
    const std::vector<double> xr = x.to_vector();  // the values as the dtype holds them
    for (size_t i = 0; i < xs.size(); ++i) {
      const long double v = xr[i], sig = 1.0L / (1.0L + std::exp(-v));
      const double want = static_cast<double>(v * sig);
      const double dwant = static_cast<double>(sig * (1.0L + v * (1.0L - sig)));
      const double tol = dt == DType::f64 ? 1e-15 : 1e-7;
      EXPECT_NEAR(y[i], want, tol * std::max(1.0, std::abs(want))) << "x = " << xs[i];
      EXPECT_NEAR(dx[i], dwant, tol * std::max(1.0, std::abs(dwant))) << "x = " << xs[i];
      EXPECT_TRUE(std::isfinite(y[i]) && std::isfinite(dx[i])) << "x = " << xs[i];
    }
  }
  GradProblem p;
  p.inputs = {{"x", random_tensor({5, 6}, 14, DType::f64, -6, 6)}};
  p.forward = [&] { return s.forward(p.inputs[0].second); };
  p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{s.backward(dy)}; };
  gradcheck(p);
}

TEST(Activations, ValuesAndGradients) {
  // GELU(1) = Phi(1) = 0.8413447460685429; tanh form 0.8411919906082768 (PyTorch's values).
  GELU g, gt(true);
  ReLU r;
  const Tensor one = Tensor::from_vector({1}, {1.0}, DType::f64);
  EXPECT_NEAR(g.forward(one).at({0}), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(gt.forward(one).at({0}), 0.8411919906082768, 1e-15);
  EXPECT_EQ(r.forward(Tensor::from_vector({2}, {-2.0, 3.0}, DType::f64)).to_vector(),
            (std::vector<double>{0, 3}));
  for (ActivationLayer* a : std::vector<ActivationLayer*>{&g, &gt, &r}) {
    GradProblem p;
    p.inputs = {{"x", random_tensor({5, 6}, 11, DType::f64, -3, 3)}};
    p.forward = [&] { return a->forward(p.inputs[0].second); };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{a->backward(dy)}; };
    gradcheck(p);
  }
  EXPECT_EQ(parse_activation("gelu"), Activation::gelu);
  EXPECT_THROW(parse_activation("swish"), Error);
}

TEST(Dropout, KeepsExpectedFractionScalesAndReplays) {
  Dropout d(0.25);
  d.manual_seed(42);
  const Tensor x = Tensor::full({100, 100}, 1.0, DType::f32);
  const Tensor y = d.forward(x);
  int kept = 0;
  for (double v : y.to_vector()) {
    if (v != 0) {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
      ++kept;
    }
  }
  EXPECT_NEAR(kept / 10000.0, 0.75, 0.02);
  // The backward applies the same pattern.
  const Tensor dx = d.backward(x);
  EXPECT_EQ(dx.to_vector(), y.to_vector());
  // Re-seeding replays the pattern; the next call draws a new one.
  d.manual_seed(42);
  EXPECT_EQ(d.forward(x).to_vector(), y.to_vector());
  EXPECT_NE(d.forward(x).to_vector(), y.to_vector());
  // Eval mode is the identity.
  d.eval();
  EXPECT_EQ(d.forward(x).to_vector(), x.to_vector());
  EXPECT_THROW(Dropout(1.0), Error);
}

TEST(Dropout, Gradcheck) {
  Dropout d(0.3);
  GradProblem p;
  p.inputs = {{"x", random_tensor({4, 9}, 12)}};
  p.forward = [&] {
    d.manual_seed(5);
    return d.forward(p.inputs[0].second);
  };
  p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{d.backward(dy)}; };
  gradcheck(p);
}

TEST(Embedding, LooksUpAndAccumulates) {
  Embedding emb(10, 4, /*padding_idx=*/0, DType::f64);
  const Tensor ids = Tensor::from_vector({2, 3}, {1, 0, 1, 9, 3, 0}, DType::i64);
  const Tensor y = emb.forward(ids);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(y.at({0, 0, c}), emb.weight().value.at({1, c}));
    EXPECT_EQ(y.at({0, 1, c}), 0.0);  // padding row is zero
  }
  emb.zero_grad();
  emb.backward(Tensor::full({2, 3, 4}, 1.0, DType::f64));
  EXPECT_EQ(emb.weight().grad.at({1, 0}), 2.0);  // id 1 used twice
  EXPECT_EQ(emb.weight().grad.at({9, 2}), 1.0);
  EXPECT_EQ(emb.weight().grad.at({0, 0}), 0.0);  // padding_idx gets no gradient
  EXPECT_THROW(emb.forward(Tensor::from_vector({1}, {10}, DType::i64)), Error);
}

TEST(FeedForward, GradcheckBothActivations) {
  for (Activation a : {Activation::relu, Activation::gelu}) {
    FeedForward ff(6, 10, a, 0.2, DType::f64);
    GradProblem p;
    p.inputs = {{"x", random_tensor({2, 3, 6}, 13)}};
    p.module = &ff;
    p.forward = [&] {
      ff.manual_seed(3);
      return ff.forward(p.inputs[0].second);
    };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{ff.backward(dy)}; };
    gradcheck(p);
    std::vector<std::string> names;
    for (auto& np : ff.named_parameters()) names.push_back(np.name);
    EXPECT_EQ(names, (std::vector<std::string>{"linear1.weight", "linear1.bias", "linear2.weight",
                                               "linear2.bias"}));
  }
}

TEST(FeedForward, WithoutBiasGradcheckSilu) {
  FeedForward ff(6, 10, Activation::silu, 0.2, DType::f64, /*bias=*/false);
  std::vector<std::string> names;
  for (auto& np : ff.named_parameters()) names.push_back(np.name);
  EXPECT_EQ(names, (std::vector<std::string>{"linear1.weight", "linear2.weight"}));
  GradProblem p;
  p.inputs = {{"x", random_tensor({2, 3, 6}, 15)}};
  p.module = &ff;
  p.forward = [&] {
    ff.manual_seed(3);
    return ff.forward(p.inputs[0].second);
  };
  p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{ff.backward(dy)}; };
  gradcheck(p);
}

TEST(Positional, SinusoidalTableAndLearnedGradcheck) {
  SinusoidalPositionalEncoding pe(8, 50, /*batch_first=*/true);
  const Tensor& t = pe.table();
  EXPECT_NEAR(t.at({3, 0}), std::sin(3.0), 1e-15);
  EXPECT_NEAR(t.at({3, 1}), std::cos(3.0), 1e-15);
  EXPECT_NEAR(t.at({5, 2}), std::sin(5.0 / std::pow(10000.0, 2.0 / 8)), 1e-15);
  const Tensor x = Tensor::zeros({2, 4, 8}, DType::f64);
  const Tensor y = pe.forward(x, 3);
  EXPECT_EQ(y.at({1, 2, 0}), std::sin(5.0));
  EXPECT_THROW(pe.forward(x, 47), Error);

  for (bool bf : {true, false}) {
    LearnedPositionalEmbedding lp(12, 6, bf, 2.0, DType::f64);
    GradProblem p;
    p.inputs = {{"x", random_tensor({3, 4, 6}, 14)}};
    p.module = &lp;
    p.forward = [&] { return lp.forward(p.inputs[0].second, 2); };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{lp.backward(dy)}; };
    gradcheck(p);
  }
}

TEST(Positional, AlibiSlopesAndT5Buckets) {
  const std::vector<double> s8 = alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  EXPECT_DOUBLE_EQ(s8[0], 0.5);
  EXPECT_DOUBLE_EQ(s8[7], 1.0 / 256);
  // 6 heads: the 4 slopes of 4 heads (2^-2, 2^-4, 2^-6, 2^-8) then slopes 1 and 3 of 8 heads (2^-1,
  // 2^-3).
  const std::vector<double> s6 = alibi_slopes(6);
  EXPECT_EQ(s6, (std::vector<double>{0.25, 1.0 / 16, 1.0 / 64, 1.0 / 256, 0.5, 0.125}));
  // T5 defaults (32 buckets, max_distance 128, bidirectional): exact below 8, log-spaced after.
  EXPECT_EQ(t5_relative_bucket(0, true, 32, 128), 0);
  EXPECT_EQ(t5_relative_bucket(-3, true, 32, 128), 3);
  EXPECT_EQ(t5_relative_bucket(3, true, 32, 128), 19);
  EXPECT_EQ(t5_relative_bucket(-20, true, 32, 128), 10);  // 8 + int(log(20/8)/log(16)*8) = 8 + 2
  EXPECT_EQ(t5_relative_bucket(-1000, true, 32, 128), 15);
  EXPECT_EQ(t5_relative_bucket(5, false, 32, 128), 0);  // causal: future keys share bucket 0
}

TEST(Masks, PolarityAndCombination) {
  const Tensor ids = Tensor::from_vector({2, 3}, {5, 0, 0, 7, 8, 9}, DType::i64);
  const Tensor pad = padding_mask(ids, 0);
  EXPECT_EQ(pad.to_vector(), (std::vector<double>{0, 1, 1, 0, 0, 0}));
  const Tensor la = look_ahead_mask(3);
  EXPECT_EQ(la.to_vector(), (std::vector<double>{0, 1, 1, 0, 0, 1, 0, 0, 0}));
  const Tensor both = combine_masks(pad, la);
  ASSERT_EQ(both.shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(both.at({0, 0, 1}), 1.0);
  EXPECT_EQ(both.at({0, 2, 0}), 0.0);
  EXPECT_EQ(both.at({1, 2, 2}), 0.0);
  EXPECT_EQ(both.at({1, 1, 2}), 1.0);
}

}  // namespace
}  // namespace attn::nn
