// The per-site dropout probabilities of the Transformer layers (TransformerLayerOptions'
// attention_dropout, activation_dropout, attention_output_dropout, ffn_output_dropout): each acts
// where it says and nowhere else, and unset sites follow `dropout` bit for bit.
//
// Each site test makes the layer's output show that site's pattern directly: a pre-norm layer whose
// other branch is zeroed (its last projection's weight and bias 0), so y = x + branch(x), and with
// only the site under test at p = 0.5 every element of y - x is either 0 or twice its eval-mode value.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;

constexpr double kP = 0.5;

TransformerLayerOptions pre_norm_f64() {
  TransformerLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 8;  // linear2 can be the identity
  o.dropout = 0.0;
  o.activation = Activation::gelu;
  o.batch_first = true;
  o.norm_first = true;
  o.dtype = DType::f64;
  return o;
}

// The parameter's value, sharing the module's memory.
Tensor param(Module& m, const std::string& name) {
  for (auto& p : m.named_parameters()) {
    if (p.name == name) return p.value;
  }
  throw std::runtime_error("no parameter " + name);
}

void set_zero(Module& m, const std::string& name) {
  Tensor t = param(m, name);
  t.copy_from(Tensor::zeros(t.shape(), t.dtype()));
}

void set_identity(Module& m, const std::string& name) {
  Tensor t = param(m, name);
  Tensor eye = Tensor::zeros(t.shape(), t.dtype());
  for (int64_t i = 0; i < t.size(0); ++i) eye.set({i, i}, 1.0);
  t.copy_from(eye);
}

// y - x of the layer in training mode (dropout on) and in eval mode.
struct Deltas {
  std::vector<double> train, eval;
};

Deltas deltas(TransformerEncoderLayer& l, const Tensor& x) {
  const std::vector<double> xs = x.to_vector();
  auto delta = [&] {
    std::vector<double> y = l.forward(x).to_vector();
    for (size_t i = 0; i < y.size(); ++i) y[i] -= xs[i];
    return y;
  };
  const NoGradGuard no_grad;
  l.train();
  l.manual_seed(3);
  Deltas d;
  d.train = delta();
  l.eval();
  d.eval = delta();
  return d;
}

// Every element either dropped (0) or kept and scaled by 1 / (1 - p), both seen often.
void expect_dropped_or_scaled(const Deltas& d) {
  int dropped = 0, kept = 0;
  for (size_t i = 0; i < d.train.size(); ++i) {
    ASSERT_GT(std::abs(d.eval[i]), 1e-9) << "element " << i << " has no signal to drop";
    if (d.train[i] == 0.0) {
      ++dropped;
    } else {
      ASSERT_NEAR(d.train[i], d.eval[i] / (1 - kP), 1e-12 * std::abs(d.eval[i]) + 1e-14)
          << "element " << i << " is neither dropped nor kept";
      ++kept;
    }
  }
  EXPECT_GT(dropped, static_cast<int>(d.train.size()) / 5);
  EXPECT_GT(kept, static_cast<int>(d.train.size()) / 5);
}

// A pre-norm f64 layer with only `site` at kP.
std::unique_ptr<TransformerEncoderLayer> layer_with(
    std::optional<double> TransformerLayerOptions::*site, uint64_t seed) {
  TransformerLayerOptions o = pre_norm_f64();
  o.*site = kP;
  manual_seed(seed);
  return std::make_unique<TransformerEncoderLayer>(o);
}

// A sublayer's last projection (weight and bias) zeroed: its branch adds nothing to y.
void zero_projection(Module& m, const std::string& name) {
  set_zero(m, name + ".weight");
  set_zero(m, name + ".bias");
}

TEST(DropoutSites, FfnOutputDropoutActsOnTheFeedForwardOutputOnly) {
  auto l = layer_with(&TransformerLayerOptions::ffn_output_dropout, 11);
  zero_projection(*l, "self_attn.out_proj");  // y = x + ff(norm2(x))
  expect_dropped_or_scaled(deltas(*l, random_tensor({3, 5, 8}, 1)));
}

TEST(DropoutSites, AttentionOutputDropoutActsOnTheAttentionOutputOnly) {
  auto l = layer_with(&TransformerLayerOptions::attention_output_dropout, 12);
  zero_projection(*l, "linear2");  // y = x + sa(norm1(x))
  expect_dropped_or_scaled(deltas(*l, random_tensor({3, 5, 8}, 2)));
}

TEST(DropoutSites, ActivationDropoutActsInsideTheFeedForward) {
  auto l = layer_with(&TransformerLayerOptions::activation_dropout, 13);
  zero_projection(*l, "self_attn.out_proj");
  set_identity(*l, "linear2.weight");  // y = x + dropout(gelu(linear1(norm2(x))))
  set_zero(*l, "linear2.bias");
  expect_dropped_or_scaled(deltas(*l, random_tensor({3, 5, 8}, 3)));
}

// One key per query: each head's softmax weight is 1, so dropping it zeroes that head's whole
// output block (D = 4 elements) and keeping it doubles the block; out_proj is the identity.
TEST(DropoutSites, AttentionDropoutActsOnTheAttentionWeights) {
  auto l = layer_with(&TransformerLayerOptions::attention_dropout, 14);
  set_identity(*l, "self_attn.out_proj.weight");
  set_zero(*l, "self_attn.out_proj.bias");
  zero_projection(*l, "linear2");
  const Deltas d = deltas(*l, random_tensor({32, 1, 8}, 4));
  expect_dropped_or_scaled(d);
  for (size_t block = 0; block < d.train.size() / 4; ++block) {
    const bool dropped = d.train[block * 4] == 0.0;
    for (size_t j = 1; j < 4; ++j) {
      EXPECT_EQ(d.train[block * 4 + j] == 0.0, dropped)
          << "head block " << block << " is dropped only in part: not the weights' dropout";
    }
  }
}

// Unset sites take `dropout`: the same layer either way, bit for bit (encoder and decoder).
TEST(DropoutSites, UnsetSitesFollowDropout) {
  TransformerLayerOptions a = pre_norm_f64();
  a.norm_first = false;
  a.dropout = 0.3;
  TransformerLayerOptions b = a;
  b.dropout = 0.0;
  b.attention_dropout = b.activation_dropout = b.attention_output_dropout = b.ffn_output_dropout =
      0.3;
  const Tensor x = random_tensor({2, 6, 8}, 5), mem = random_tensor({2, 4, 8}, 6);
  auto encode = [&](const TransformerLayerOptions& o) {
    manual_seed(21);
    TransformerEncoderLayer l(o);
    l.manual_seed(2);
    return l.forward(x).to_vector();
  };
  auto decode = [&](const TransformerLayerOptions& o) {
    manual_seed(22);
    TransformerDecoderLayer l(o);
    l.manual_seed(2);
    return l.forward(x, mem).to_vector();
  };
  EXPECT_EQ(encode(a), encode(b));
  EXPECT_EQ(decode(a), decode(b));
  TransformerLayerOptions none = b;
  none.attention_dropout.reset();  // now dropout = 0 there
  EXPECT_NE(encode(none), encode(b));
}

TEST(DropoutSites, RefusesAProbabilityOutsideZeroToOneNamingTheSite) {
  TransformerLayerOptions o = pre_norm_f64();
  o.activation_dropout = 1.0;
  try {
    TransformerEncoderLayer l(o);
    FAIL() << "accepted activation_dropout = 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation_dropout must be in [0, 1), got 1"),
              std::string::npos)
        << e.what();
  }
  o.activation_dropout.reset();
  o.ffn_output_dropout = -0.1;
  EXPECT_THROW(TransformerDecoderLayer{o}, Error);
}

}  // namespace
}  // namespace attn::nn
