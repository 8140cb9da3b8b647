// BertModel's loader on small fake checkpoints written with attn's safetensors writer: a round
// trip, refusals of missing / extra / misshapen tensors and of configs attn cannot run, each naming
// the culprit and leaving the model unchanged; and forward properties (embeddings by hand,
// padding); RoBERTa's positions and DistilBERT's names. python/tests/test_models_bert.py compares
// the real all-MiniLM-L6-v2 with transformers, python/tests/test_models_family.py tiny RoBERTa and
// DistilBERT models.
#include "attn/models/bert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "attn/io.h"
#include "attn/memory.h"
#include "attn/nn/layers.h"
#include "attn/nn/module.h"
#include "core/io_test_util.h"
#include "models/bert_test_util.h"

namespace attn::models {
namespace {

using testing::tiny_config;
using testing_io::expect_error;
using testing_io::ScratchDir;
using testing_io::write_bytes;

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

// A checkpoint's tensors are not left parked in the buffer cache (attn/memory.h) after loading:
// their sizes are not the forward's, and BERT-base's 850 MB of them crowded its buffers out. The
// word embeddings here (2048 x 64 f32, 512 KiB) are over the cache's 256 KiB threshold.
TEST(BertLoad, LeavesNoCheckpointBuffersInTheCache) {
  BertConfig c = tiny_config(1);
  c.vocab_size = 2048;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  nn::manual_seed(2);
  BertModel a(c);
  ScratchDir dir;
  write_folder(dir, a.hf_state_dict(),
               R"({"model_type": "bert", "vocab_size": 2048, "hidden_size": 64,
  "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128,
  "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
  "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": 0})");
  release_cached_memory();
  BertModel b = BertModel::from_pretrained(dir.path().string());
  EXPECT_EQ(cached_memory_bytes(), 0u);
  const Tensor ids = ids_tensor({{2, 7, 9, 3}});
  EXPECT_EQ(max_abs_diff(a.forward(ids).last_hidden_state, b.forward(ids).last_hidden_state), 0.0);
  // The other two checkpoint loads: into a BertModel, and nn::Module::load (a 512 x 512 Linear: 1 MiB).
  release_cached_memory();
  b.load_safetensors(dir.file("model.safetensors"));
  EXPECT_EQ(cached_memory_bytes(), 0u);
  nn::Linear lin(512, 512);
  lin.save(dir.file("linear.safetensors"));
  release_cached_memory();
  lin.load(dir.file("linear.safetensors"));
  EXPECT_EQ(cached_memory_bytes(), 0u);
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

// ---- RoBERTa and DistilBERT ----

BertConfig tiny_roberta(int64_t layers = 2) {
  BertConfig c = tiny_config(layers);
  c.model_type = "roberta";
  c.type_vocab_size = 1;
  c.pad_token_id = 1;
  c.layer_norm_eps = 1e-5;
  return c;
}

// HF's create_position_ids_from_input_ids, by hand: a pad id (1) gets position 1, the others
// 2, 3, ... counting only non-pad ids, wherever the pads are (the attention_mask plays no part).
TEST(RobertaForward, PositionsCountNonPadIdsFromPadPlusOne) {
  nn::manual_seed(9);
  BertModel m(tiny_roberta(0), false);
  const Tensor ids = ids_tensor({{0, 5, 7, 2, 1, 1}, {0, 1, 5, 2, 1, 1}, {1, 1, 0, 9, 9, 2}});
  const std::vector<double> want = {2, 3, 4, 5, 1, 1, 2, 1, 3, 4, 1, 1, 1, 1, 2, 3, 4, 5};
  EXPECT_EQ(m.position_ids(ids).to_vector(), want);
  // And forward adds exactly those rows: LayerNorm(word + position[pos] + token_type[0]).
  std::map<std::string, Tensor> w;
  for (auto& [n, t] : m.hf_state_dict()) w[n] = t;
  const Tensor h = m.forward(ids).last_hidden_state;
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t i = 0; i < 6; ++i) {
      const auto pos = static_cast<int64_t>(want[b * 6 + i]);
      std::vector<double> x(8);
      double mean = 0, var = 0;
      for (int64_t d = 0; d < 8; ++d) {
        x[d] =
            w["embeddings.word_embeddings.weight"].at({static_cast<int64_t>(ids.at({b, i})), d}) +
            w["embeddings.position_embeddings.weight"].at({pos, d}) +
            w["embeddings.token_type_embeddings.weight"].at({0, d});
        mean += x[d] / 8;
      }
      for (double v : x) var += (v - mean) * (v - mean) / 8;
      for (int64_t d = 0; d < 8; ++d) {
        const double want_h =
            (x[d] - mean) / std::sqrt(var + 1e-5) * w["embeddings.LayerNorm.weight"].at({d}) +
            w["embeddings.LayerNorm.bias"].at({d});
        EXPECT_NEAR(h.at({b, i, d}), want_h, 2e-6) << b << "," << i << "," << d;
      }
    }
  }
  // max_position_embeddings 16 holds positions up to 15: 14 non-pad ids per row, however long
  // the row is with pads.
  std::vector<int64_t> row(14, 4);
  row.resize(20, 1);
  EXPECT_EQ(m.position_ids(ids_tensor({row})).to_vector().back(), 1.0);
  EXPECT_EQ(m.forward(ids_tensor({row})).last_hidden_state.shape(), (Shape{1, 20, 8}));
  row[14] = 4;
  expect_error(
      [&] {
        m.forward(ids_tensor({{2, 3}, row}, 1));
      },
      {"row 1 has 15 tokens that are not pad_token_id 1", "at most 14",
       "max_position_embeddings 16"});
}

TEST(RobertaLoad, TaskCheckpointUnderRobertaPrefixAndConfigChecks) {
  nn::manual_seed(10);
  BertModel a(tiny_roberta());
  TensorList t;
  for (auto& [name, v] : a.hf_state_dict()) t.emplace_back("roberta." + name, v);
  t.emplace_back("lm_head.bias", Tensor::zeros({50}, DType::f32));
  ScratchDir dir;
  const std::string cfg = R"({"model_type": "roberta", "vocab_size": 50, "hidden_size": 8,
    "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16,
    "max_position_embeddings": 16, "type_vocab_size": 1, "layer_norm_eps": 1e-05,
    "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": 1})";
  write_folder(dir, t, cfg);
  BertModel b = BertModel::from_pretrained(dir.path().string());
  EXPECT_EQ(b.config().model_type, "roberta");
  EXPECT_EQ(b.config().pad_token_id, 1);
  EXPECT_EQ(b.config().layer_norm_eps, 1e-5);
  const Tensor ids = ids_tensor({{0, 7, 9, 2}, {0, 5, 2, 1}}, 1);
  const Tensor mask = ids_tensor({{1, 1, 1, 1}, {1, 1, 1, 0}});
  EXPECT_EQ(
      max_abs_diff(a.forward(ids, mask).last_hidden_state, b.forward(ids, mask).last_hidden_state),
      0.0);
  // BERT-prefixed tensors are not RoBERTa's.
  TensorList bert;
  for (auto& [name, v] : a.hf_state_dict()) bert.emplace_back("bert." + name, v);
  write_folder(dir, bert, cfg);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"missing 37", "unexpected 39", "bert.embeddings.word_embeddings.weight"});
  std::string s = cfg;
  s.replace(s.find(R"("absolute")"), 10, R"("relative_key_query")");
  write_bytes(dir.file("config.json"), s);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"position_embedding_type 'relative_key_query'"});
  s = cfg;
  s.replace(s.find(R"("pad_token_id": 1)"), 17, R"("pad_token_id": 15)");
  write_bytes(dir.file("config.json"), s);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"roberta counts positions from pad_token_id + 1", "pad_token_id 15"});
}

const char* kTinyDistilJson = R"({"model_type": "distilbert", "vocab_size": 50, "dim": 8,
  "n_layers": 2, "n_heads": 2, "hidden_dim": 16, "max_position_embeddings": 16,
  "activation": "gelu", "pad_token_id": 0, "sinusoidal_pos_embds": false})";

// DistilBERT is BERT with other names and no token types: a BERT whose token-type row is zero,
// renamed by hand, must load as a DistilBERT and compute the same numbers.
TEST(DistilBertLoad, RenamedBertWithoutTokenTypesComputesTheSame) {
  nn::manual_seed(11);
  BertModel bert(tiny_config(), false);
  const std::vector<std::pair<std::string, std::string>> rename = {
      {"encoder.layer.", "transformer.layer."},
      {"attention.self.query", "attention.q_lin"},
      {"attention.self.key", "attention.k_lin"},
      {"attention.self.value", "attention.v_lin"},
      {"attention.output.dense", "attention.out_lin"},
      {"attention.output.LayerNorm", "sa_layer_norm"},
      {"intermediate.dense", "ffn.lin1"},
      {"output.dense", "ffn.lin2"},
      {"output.LayerNorm", "output_layer_norm"}};
  TensorList bert_sd = bert.hf_state_dict(), distil;
  int64_t k = 0;
  for (auto& [name, t] : bert_sd) {
    if (name == "embeddings.token_type_embeddings.weight") {
      t = Tensor::zeros(t.shape(), DType::f32);
      continue;
    }
    // Every tensor moved off its initial value (LayerNorm's are all 1 or 0), so that no two tensors
    // of a shape could be swapped unseen.
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] += 0.3f * static_cast<float>(std::sin(++k));
    std::string n = name;
    for (const auto& [from, to] : rename) {
      if (const size_t at = n.find(from); at != std::string::npos) n.replace(at, from.size(), to);
    }
    distil.emplace_back("distilbert." + n, t);
  }
  bert.load_hf_state_dict(bert_sd);
  distil.emplace_back("vocab_projector.bias", Tensor::zeros({50}, DType::f32));  // a task head
  ScratchDir dir;
  write_folder(dir, distil, kTinyDistilJson);
  BertModel d = BertModel::from_pretrained(dir.path().string());
  EXPECT_FALSE(d.has_pooler());
  EXPECT_EQ(d.config().hidden_size, 8);
  EXPECT_EQ(d.config().intermediate_size, 16);
  EXPECT_EQ(d.config().type_vocab_size, 0);
  const TensorList names = d.hf_state_dict();
  EXPECT_EQ(names.size(), 4u + 2 * 16);
  EXPECT_EQ(names[4].first, "transformer.layer.0.attention.q_lin.weight");
  const Tensor ids = ids_tensor({{2, 7, 9, 3, 0}, {2, 5, 6, 8, 3}});
  const Tensor mask = ids_tensor({{1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}});
  const BertOutput ob = bert.forward(ids, mask, {}, true), od = d.forward(ids, mask, {}, true);
  EXPECT_LT(max_abs_diff(ob.last_hidden_state, od.last_hidden_state), 1e-6);
  EXPECT_LT(max_abs_diff(ob.attentions[1], od.attentions[1]), 1e-7);
  EXPECT_FALSE(od.pooler_output.defined());
  // A WordPiece tokenizer's all-zero token_type_ids are accepted; others are not.
  // (Compared with a forward without attentions: asking for them may run another kernel, within
  // the contract's tolerance of this one.)
  EXPECT_EQ(max_abs_diff(d.forward(ids, mask, Tensor::zeros({2, 5}, DType::i64)).last_hidden_state,
                         d.forward(ids, mask).last_hidden_state),
            0.0);
  expect_error([&] { d.forward(ids, mask, mask); },
               {"distilbert has no token types", "token_type_ids must be all 0"});
}

TEST(DistilBertLoad, RefusesWrongTensorsAndConfigsNamingThem) {
  nn::manual_seed(12);
  BertConfig c = tiny_config();
  c.model_type = "distilbert";
  c.type_vocab_size = 0;
  BertModel a(c, false);
  const TensorList good = a.hf_state_dict();
  ScratchDir dir;
  TensorList bad = without(good, "transformer.layer.1.ffn.lin2.bias");
  bad.emplace_back("embeddings.token_type_embeddings.weight", Tensor::zeros({2, 8}, DType::f32));
  for (auto& [name, t] : bad) {
    if (name == "transformer.layer.0.sa_layer_norm.weight") t = Tensor::zeros({9}, DType::f32);
  }
  write_folder(dir, bad, kTinyDistilJson);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); },
               {"missing 1: transformer.layer.1.ffn.lin2.bias",
                "unexpected 1: embeddings.token_type_embeddings.weight",
                "transformer.layer.0.sa_layer_norm.weight is [9], expected [8]"});
  write_folder(dir, good, kTinyDistilJson);
  EXPECT_NO_THROW(BertModel::from_pretrained(dir.path().string()));
  std::string s = kTinyDistilJson;
  s.replace(s.find(R"("gelu")"), 6, R"("mish")");
  write_bytes(dir.file("config.json"), s);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); }, {"activation 'mish'"});
  s = kTinyDistilJson;
  s.replace(s.find(R"("dim": 8,)"), 9, "");
  write_bytes(dir.file("config.json"), s);
  expect_error([&] { BertModel::from_pretrained(dir.path().string()); }, {"'dim' is missing"});
  c.type_vocab_size = 2;
  expect_error([&] { BertModel m(c); }, {"distilbert has no token types"});
  c.model_type = "xlm-roberta";
  expect_error([&] { BertModel m(c); }, {"model_type 'xlm-roberta' is not supported", "roberta"});
}

}  // namespace
}  // namespace attn::models
