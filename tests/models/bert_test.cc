// BertModel's loader on small fake checkpoints written with attn's safetensors writer: a round
// trip, refusals of missing / extra / misshapen tensors and of configs attn cannot run, each naming
// the culprit and leaving the model unchanged; and forward properties (embeddings by hand,
// padding). tests/python/test_models_bert.py compares the real all-MiniLM-L6-v2 with transformers.
#include "attn/models/bert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "attn/io.h"
#include "attn/nn/module.h"
#include "core/io_test_util.h"

namespace attn::models {
namespace {

using testing_io::expect_error;
using testing_io::ScratchDir;
using testing_io::write_bytes;

BertConfig tiny_config(int64_t layers = 2) {
  BertConfig c;
  c.vocab_size = 50;
  c.hidden_size = 8;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 2;
  c.intermediate_size = 16;
  c.max_position_embeddings = 16;
  c.type_vocab_size = 2;
  c.layer_norm_eps = 1e-12;
  return c;
}

const char* kTinyConfigJson = R"({"model_type": "bert", "vocab_size": 50, "hidden_size": 8,
  "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16,
  "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
  "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": 0})";

Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows, int64_t pad = 0) {
  size_t L = 0;
  for (const auto& r : rows) L = std::max(L, r.size());
  Tensor t = Tensor::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(L)},
                          static_cast<double>(pad), DType::i64);
  for (size_t b = 0; b < rows.size(); ++b) {
    for (size_t i = 0; i < rows[b].size(); ++i) {
      t.data_as<int64_t>()[b * L + i] = rows[b][i];
    }
  }
  return t;
}

TensorList without(TensorList t, const std::string& name) {
  std::erase_if(t, [&](const auto& p) { return p.first == name; });
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

void write_folder(const ScratchDir& dir, const TensorList& tensors,
                  const std::string& config = kTinyConfigJson) {
  write_bytes(dir.file("config.json"), config);
  write_safetensors(dir.file("model.safetensors"), tensors);
}

TEST(BertLoad, RoundTripThroughAFolderGivesTheSameModel) {
  nn::manual_seed(1);
  BertModel a(tiny_config());
  ScratchDir dir;
  write_folder(dir, a.hf_state_dict());
  BertModel b = BertModel::from_pretrained(dir.path().string());
  EXPECT_TRUE(b.has_pooler());
  const Tensor ids = ids_tensor({{2, 7, 9, 3}, {2, 5, 3}});
  const Tensor mask = ids_tensor({{1, 1, 1, 1}, {1, 1, 1}});
  const BertOutput oa = a.forward(ids, mask), ob = b.forward(ids, mask);
  EXPECT_EQ(max_abs_diff(oa.last_hidden_state, ob.last_hidden_state), 0.0);
  EXPECT_EQ(max_abs_diff(oa.pooler_output, ob.pooler_output), 0.0);
  // Every HF name is there, q/k/v split out of in_proj in HF's order.
  const TensorList hf = b.hf_state_dict();
  EXPECT_EQ(hf.size(), 5u + 2 * 16 + 2);
  EXPECT_EQ(hf[5].first, "encoder.layer.0.attention.self.query.weight");
}

TEST(BertLoad, RefusesMissingExtraAndMisshapenTensorsNamingThemAndChangesNothing) {
  nn::manual_seed(2);
  BertModel source(tiny_config());
  const TensorList good = source.hf_state_dict();
  nn::manual_seed(3);
  BertModel target(tiny_config());
  const Tensor ids = ids_tensor({{2, 7, 9, 3}});
  const Tensor before = target.forward(ids).last_hidden_state;

  expect_error(
      [&] { target.load_hf_state_dict(without(good, "encoder.layer.1.attention.self.key.bias")); },
      {"missing 1", "encoder.layer.1.attention.self.key.bias", "nothing was loaded"});
  TensorList extra = good;
  extra.emplace_back("encoder.layer.2.output.dense.weight", Tensor::zeros({8, 16}, DType::f32));
  expect_error([&] { target.load_hf_state_dict(extra); },
               {"unexpected 1", "encoder.layer.2.output.dense.weight"});
  TensorList bad = good;
  for (auto& [name, t] : bad) {
    if (name == "encoder.layer.0.attention.self.value.weight")
      t = Tensor::zeros({8, 9}, DType::f32);
  }
  expect_error(
      [&] { target.load_hf_state_dict(bad); },
      {"wrong shape 1", "encoder.layer.0.attention.self.value.weight is [8, 9], expected [8, 8]"});
  // Everything at once is reported at once.
  TensorList all = without(bad, "pooler.dense.bias");
  all.emplace_back("stray", Tensor::zeros({1}, DType::f32));
  expect_error([&] { target.load_hf_state_dict(all); },
               {"missing 1", "pooler.dense.bias", "unexpected 1", "stray", "wrong shape 1"});

  EXPECT_EQ(max_abs_diff(target.forward(ids).last_hidden_state, before), 0.0);
  target.load_hf_state_dict(good);  // and a good one does load
  EXPECT_EQ(
      max_abs_diff(target.forward(ids).last_hidden_state, source.forward(ids).last_hidden_state),
      0.0);
}

TEST(BertLoad, RefusesAPartlyWrittenSafetensorsFile) {
  nn::manual_seed(4);
  BertModel a(tiny_config());
  ScratchDir dir;
  write_folder(dir, a.hf_state_dict());
  const std::string bytes = testing_io::read_bytes(dir.file("model.safetensors"));
  write_bytes(dir.file("model.safetensors"), bytes.substr(0, bytes.size() - 100));
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); }, {"model.safetensors"});
}

TEST(BertLoad, TaskCheckpointUnderBertPrefixLoadsAndIgnoresItsHead) {
  nn::manual_seed(5);
  BertModel a(tiny_config(), /*add_pooling_layer=*/false);
  TensorList t;
  for (auto& [name, v] : a.hf_state_dict()) t.emplace_back("bert." + name, v);
  t.emplace_back("bert.embeddings.position_ids", Tensor::zeros({1, 16}, DType::i64));
  t.emplace_back("cls.predictions.bias", Tensor::zeros({50}, DType::f32));
  ScratchDir dir;
  write_folder(dir, t);
  BertModel b = BertModel::from_pretrained(dir.path().string());
  EXPECT_FALSE(b.has_pooler());
  const Tensor ids = ids_tensor({{2, 7, 3}});
  EXPECT_EQ(max_abs_diff(a.forward(ids).last_hidden_state, b.forward(ids).last_hidden_state), 0.0);
  EXPECT_FALSE(b.forward(ids).pooler_output.defined());
}

TEST(BertLoad, RefusesConfigsItCannotRun) {
  ScratchDir dir;
  nn::manual_seed(6);
  write_folder(dir, BertModel(tiny_config()).hf_state_dict());
  std::string cfg = kTinyConfigJson;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = cfg;
    s.replace(s.find(from), from.size(), to);
    write_bytes(dir.file("config.json"), s);
  };
  with(R"("absolute")", R"("relative_key")");
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"config.json", "position_embedding_type 'relative_key'"});
  with(R"("model_type": "bert")", R"("model_type": "gpt2")");
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); }, {"model_type 'gpt2'"});
  with(R"("num_attention_heads": 2)", R"("num_attention_heads": 3)");
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"hidden_size 8 is not a multiple of num_attention_heads 3"});
  with(R"("hidden_act": "gelu")", R"("hidden_act": "mish")");
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); }, {"hidden_act 'mish'"});
  with(R"("hidden_size": 8)", R"("hidden_size": 16)");  // a config the tensors do not fit
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"embeddings.word_embeddings.weight is [50, 8], expected [50, 16]"});
  std::filesystem::remove(dir.file("model.safetensors"));
  write_bytes(dir.file("pytorch_model.bin"), "x");
  write_bytes(dir.file("config.json"), cfg);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"pytorch_model.bin", "safetensors"});
  expect_error([&] { BertModel::from_pretrained(dir.file("nope")); }, {"not a folder"});
}

// With no layer, the output is LayerNorm(word + position + token_type): checked by hand.
TEST(BertForward, EmbeddingsByHand) {
  nn::manual_seed(7);
  BertModel m(tiny_config(0), false);
  std::map<std::string, Tensor> w;
  for (auto& [n, t] : m.hf_state_dict()) w[n] = t;
  const Tensor ids = ids_tensor({{4, 9, 11}});
  const Tensor types = ids_tensor({{0, 1, 1}});
  const Tensor h = m.forward(ids, {}, types).last_hidden_state;
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<double> x(8);
    double mean = 0;
    for (int64_t d = 0; d < 8; ++d) {
      x[d] = w["embeddings.word_embeddings.weight"].at({static_cast<int64_t>(ids.at({0, i})), d}) +
             w["embeddings.position_embeddings.weight"].at({i, d}) +
             w["embeddings.token_type_embeddings.weight"].at(
                 {static_cast<int64_t>(types.at({0, i})), d});
      mean += x[d] / 8;
    }
    double var = 0;
    for (double v : x) var += (v - mean) * (v - mean) / 8;
    for (int64_t d = 0; d < 8; ++d) {
      const double want =
          (x[d] - mean) / std::sqrt(var + 1e-12) * w["embeddings.LayerNorm.weight"].at({d}) +
          w["embeddings.LayerNorm.bias"].at({d});
      EXPECT_NEAR(h.at({0, i, d}), want, 2e-6) << i << "," << d;
    }
  }
}

TEST(BertForward, PaddingChangesNoRealTokenAndGetsNoWeight) {
  nn::manual_seed(8);
  BertModel m(tiny_config());
  const BertOutput alone = m.forward(ids_tensor({{2, 7, 9, 3}}), {}, {}, true);
  const Tensor ids = ids_tensor({{2, 7, 9, 3, 0, 0}, {2, 5, 6, 8, 9, 3}});
  const Tensor mask = ids_tensor({{1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const BertOutput padded = m.forward(ids, mask, {}, true);
  EXPECT_LT(max_abs_diff(padded.last_hidden_state.select(0, 0).slice(0, 0, 4),
                         alone.last_hidden_state.select(0, 0)),
            2e-6);
  EXPECT_LT(max_abs_diff(padded.pooler_output.select(0, 0), alone.pooler_output.select(0, 0)),
            2e-6);
  ASSERT_EQ(padded.attentions.size(), 2u);
  for (const Tensor& a : padded.attentions) {
    EXPECT_EQ(a.shape(), (Shape{2, 2, 6, 6}));
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 6; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 6; ++j) sum += a.at({0, h, i, j});
        EXPECT_NEAR(sum, 1.0, 1e-6);
        EXPECT_EQ(a.at({0, h, i, 4}), 0.0);
        EXPECT_EQ(a.at({0, h, i, 5}), 0.0);
      }
    }
  }
  expect_error([&] { m.forward(ids_tensor({{2, 50}})); }, {"input_ids holds 50", "[0, 50)"});
  expect_error([&] { m.forward(ids_tensor({std::vector<int64_t>(17, 1)})); },
               {"17 tokens exceed max_position_embeddings 16"});
}

}  // namespace
}  // namespace attn::models
