// BertModel's dropout for fine-tuning: the config's probabilities (per family's key names), applied
// in training mode only, reproducible from manual_seed, and the backward through the same patterns
// (finite differences in f32 with the patterns fixed by re-seeding).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attn/models/bert.h"
#include "attn/nn/module.h"
#include "core/io_test_util.h"
#include "models/bert_test_util.h"

namespace attn::models {
namespace {

using testing_io::expect_error;
using testing_io::ScratchDir;
using testing_io::write_bytes;

BertConfig tiny(int64_t layers, double hidden, double attention) {
  BertConfig c = testing::tiny_config(layers);
  c.hidden_dropout_prob = hidden;
  c.attention_probs_dropout_prob = attention;
  return c;
}

Tensor ids() {
  std::vector<double> v;
  for (int64_t i = 0; i < 2 * 7; ++i) v.push_back(static_cast<double>((i * 7 + 3) % 40));
  return Tensor::from_vector({2, 7}, v, DType::i64);
}

std::vector<double> hidden(BertModel& m) {
  return m.forward(ids()).last_hidden_state.to_vector();
}

TEST(BertDropout, ConfigReadsEachFamilysKeysAndRefusesBadValues) {
  ScratchDir dir;
  const std::string head = R"({"vocab_size": 40, "max_position_embeddings": 16, )";
  const std::string bert = head + R"("model_type": "bert", "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16)";
  const std::string distil = head + R"("model_type": "distilbert", "dim": 8, "n_layers": 1,
      "n_heads": 2, "hidden_dim": 16)";
  auto read = [&](const std::string& json) {
    write_bytes(dir.file("config.json"), json);
    return BertConfig::from_json_file(dir.file("config.json"));
  };
  BertConfig c = read(bert + "}");  // transformers' defaults when absent
  EXPECT_EQ(c.hidden_dropout_prob, 0.1);
  EXPECT_EQ(c.attention_probs_dropout_prob, 0.1);
  c = read(bert + R"(, "hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.3})");
  EXPECT_EQ(c.hidden_dropout_prob, 0.2);
  EXPECT_EQ(c.attention_probs_dropout_prob, 0.3);
  c = read(distil + R"(, "dropout": 0.25, "attention_dropout": 0.35})");
  EXPECT_EQ(c.hidden_dropout_prob, 0.25);
  EXPECT_EQ(c.attention_probs_dropout_prob, 0.35);
  expect_error([&] { read(bert + R"(, "attention_probs_dropout_prob": 1.0})"); },
               {"config.json", "attention_probs_dropout_prob must be in [0, 1), got 1"});
  expect_error([&] { read(distil + R"(, "dropout": -0.5})"); },
               {"dropout must be in [0, 1), got -0.5"});
  expect_error([&] { read(bert + R"(, "hidden_dropout_prob": "0.1"})"); },
               {"'hidden_dropout_prob' must be a number"});
}

// No layer and no pooler: last_hidden_state = dropout(LayerNorm(embeddings)), so every element is 0
// or its eval value / (1 - p).
TEST(BertDropout, EmbeddingsOutputIsDroppedInTrainingOnly) {
  nn::manual_seed(3);
  BertModel m(tiny(0, 0.5, 0.0), false);
  const std::vector<double> ev = hidden(m);
  m.train();
  m.manual_seed(9);
  const std::vector<double> tr = hidden(m);
  int dropped = 0;
  for (size_t i = 0; i < tr.size(); ++i) {
    if (tr[i] == 0.0) {
      ++dropped;
    } else {
      EXPECT_NEAR(tr[i], 2 * ev[i], 1e-6 * std::abs(ev[i]) + 1e-7) << "element " << i;
    }
  }
  EXPECT_GT(dropped, static_cast<int>(tr.size()) / 5);
  EXPECT_LT(dropped, static_cast<int>(tr.size()) * 4 / 5);
  m.eval();
  EXPECT_EQ(hidden(m), ev);
}

TEST(BertDropout, TrainingForwardsAreReproducibleFromTheSeed) {
  nn::manual_seed(4);
  BertModel m(tiny(2, 0.2, 0.2));
  const std::vector<double> ev = hidden(m);
  m.train();
  m.manual_seed(5);
  const std::vector<double> a = hidden(m);
  m.manual_seed(5);
  EXPECT_EQ(hidden(m), a);
  m.manual_seed(6);
  EXPECT_NE(hidden(m), a);
  EXPECT_NE(a, ev);
  nn::manual_seed(4);
  BertModel off(tiny(2, 0.0, 0.0));
  off.train();
  EXPECT_EQ(hidden(off), ev);  // no dropout: training computes what eval does
}

// loss = sum(last_hidden_state * w + pooler_output * u) with every dropout at 0.3, the patterns
// fixed by re-seeding before each forward: backward's gradients against central differences.
TEST(BertDropout, BackwardFollowsTheForwardsPatterns) {
  nn::manual_seed(7);
  BertModel m(tiny(2, 0.3, 0.3));
  m.train();
  const Tensor w = Tensor::from_vector(
      {2, 7, 8},
      [] {
        std::vector<double> v;
        for (int i = 0; i < 2 * 7 * 8; ++i) v.push_back(std::sin(0.7 * i));
        return v;
      }(),
      DType::f32);
  const Tensor u = Tensor::full({2, 8}, 0.5, DType::f32);
  auto loss = [&] {
    m.manual_seed(11);
    const BertOutput o = m.forward(ids());
    double s = 0;
    const std::vector<double> h = o.last_hidden_state.to_vector(), x = w.to_vector();
    for (size_t i = 0; i < h.size(); ++i) s += h[i] * x[i];
    for (double p : o.pooler_output.to_vector()) s += 0.5 * p;
    return s;
  };
  m.zero_grad();
  loss();
  m.backward(w, u);
  int checked = 0;
  for (auto& p : m.named_parameters()) {
    if (p.name != "embeddings.position_embeddings.weight" &&
        p.name != "encoder.layer.0.linear1.weight" && p.name != "encoder.layer.1.norm1.weight") {
      continue;
    }
    float* v = p.value.data_as<float>();
    const std::vector<double> g = p.grad.to_vector();
    double scale = 0;
    for (double x : g) scale = std::max(scale, std::abs(x));
    for (int64_t i = 0; i < p.value.numel(); i += 5) {
      const float keep = v[i], h = 1e-2f;
      v[i] = keep + h;
      const double up = loss();
      v[i] = keep - h;
      const double down = loss();
      v[i] = keep;
      EXPECT_NEAR((up - down) / (2.0 * h), g[static_cast<size_t>(i)], 2e-2 * scale)
          << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

}  // namespace
}  // namespace attn::models
