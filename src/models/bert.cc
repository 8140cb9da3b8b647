// BertModel from attn::nn pieces, and the one map between HuggingFace's tensor names and attn's.
#include "attn/models/bert.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "attn/error.h"
#include "attn/nn/layers.h"
#include "attn/nn/transformer.h"
#include "core/storage_cache.h"
#include "models/bert_net.h"
#include "nn/bf16.h"

namespace attn::models {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& msg) {
  throw Error("attn::models::BertModel: " + msg);
}

// `key` is the config field the activation came from (hidden_act; DistilBERT's activation).
nn::Activation activation_of(const std::string& act, const char* key) {
  if (act == "gelu") return nn::Activation::gelu;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return nn::Activation::gelu_tanh;
  if (act == "relu") return nn::Activation::relu;
  if (act == "silu" || act == "swish") return nn::Activation::silu;
  fail(fmt::format("{} '{}' is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu, silu)", key,
                   act));
}

// ---- the families: each one's HF tensor names, the only place that knows them ----

// BERT, RoBERTa and DistilBERT run the same network (embeddings -> LayerNorm -> post-norm encoder
// layers); they differ in their tensor names, in whether there are token types, and in RoBERTa's
// positions. A layer's tensors are `layer` + index + "." + the name of the sublayer.
struct LayerNames {
  const char* layer;
  const char* qkv[3];
  const char* out_proj;
  const char* norm1;  // after attention
  const char* linear1;
  const char* linear2;
  const char* norm2;  // after the feed-forward
};

// BERT's, which RoBERTa keeps (transformers' RobertaLayer is BertLayer under another name).
constexpr LayerNames kBertLayers = {
    "encoder.layer.",
    {"attention.self.query", "attention.self.key", "attention.self.value"},
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm"};

constexpr LayerNames kDistilBertLayers = {
    "transformer.layer.", {"attention.q_lin", "attention.k_lin", "attention.v_lin"},
    "attention.out_lin",  "sa_layer_norm",
    "ffn.lin1",           "ffn.lin2",
    "output_layer_norm"};

// config.json's names of the BertConfig fields that DistilBertConfig renames.
struct ConfigKeys {
  const char* hidden_size;
  const char* num_hidden_layers;
  const char* num_attention_heads;
  const char* intermediate_size;
  const char* hidden_act;
  const char* hidden_dropout_prob;
  const char* attention_probs_dropout_prob;
};

constexpr ConfigKeys kBertKeys = {
    "hidden_size", "num_hidden_layers",   "num_attention_heads",         "intermediate_size",
    "hidden_act",  "hidden_dropout_prob", "attention_probs_dropout_prob"};
constexpr ConfigKeys kDistilBertKeys = {"dim",        "n_layers", "n_heads",          "hidden_dim",
                                        "activation", "dropout",  "attention_dropout"};

struct Family {
  const char* model_type;
  const char* prefix;  // a task model (BertForMaskedLM, ...) keeps the encoder under it
  const LayerNames& names;
  const ConfigKeys& keys;
  int64_t pad_token_id;  // when config.json has none
  bool token_types;      // embeddings.token_type_embeddings
  // RoBERTa (HF's create_position_ids_from_input_ids): a token that is not pad_token_id gets
  // pad_token_id + 1 + (the number of such tokens before it); a pad token gets pad_token_id.
  bool positions_from_pad;
  // hidden_dropout_prob also on the attention sublayer's output (BERT's BertSelfOutput; DistilBERT
  // drops only the embeddings' and the feed-forward's outputs, and the attention weights).
  bool attention_output_dropout;
};

constexpr Family kFamilies[] = {
    {"bert", "bert.", kBertLayers, kBertKeys, 0, true, false, true},
    {"roberta", "roberta.", kBertLayers, kBertKeys, 1, true, true, true},
    {"distilbert", "distilbert.", kDistilBertLayers, kDistilBertKeys, 0, false, false, false},
};

const Family& family_of(const std::string& model_type, const std::string& where) {
  for (const Family& f : kFamilies) {
    if (model_type == f.model_type) return f;
  }
  fail(fmt::format(
      "{}: model_type '{}' is not supported (bert, which includes MiniLM; roberta; distilbert)",
      where, model_type));
}

// ---- the name map: HF tensor -> attn parameter (the only place that knows both) ----

struct NameMap {
  std::string hf;    // e.g. "encoder.layer.0.attention.self.query.weight"
  std::string attn;  // e.g. "encoder.layer.0.self_attn.in_proj_weight"
  Shape shape;       // the HF tensor's shape
  int64_t row = -1;  // >= 0: the HF tensor is rows [row, row + shape[0]) of the attn tensor
};

std::vector<NameMap> name_map(const BertConfig& c, bool pooler) {
  const Family& f = family_of(c.model_type, "BertConfig");
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  std::vector<NameMap> m = {
      {"embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight", {c.vocab_size, H}},
      {"embeddings.position_embeddings.weight",
       "embeddings.position_embeddings.weight",
       {c.max_position_embeddings, H}},
  };
  if (f.token_types) {
    m.push_back({"embeddings.token_type_embeddings.weight",
                 "embeddings.token_type_embeddings.weight",
                 {c.type_vocab_size, H}});
  }
  // HF's <hf>weight [w] and <hf>bias [b] -> attn's <at>weight and <at>bias (rows from `row` on).
  const auto weight_and_bias = [&m](const std::string& hf, const std::string& at, Shape w, Shape b,
                                    int64_t row = -1) {
    m.push_back({hf + "weight", at + "weight", std::move(w), row});
    m.push_back({hf + "bias", at + "bias", std::move(b), row});
  };
  weight_and_bias("embeddings.LayerNorm.", "embeddings.LayerNorm.", {H}, {H});
  const LayerNames& n = f.names;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    // the sublayer `sub`'s tensors: HF's <layer><l>.<sub>.
    const auto hf = [&](const char* sub) { return fmt::format("{}{}.{}.", n.layer, l, sub); };
    const std::string at = fmt::format("encoder.layer.{}.", l);
    for (int k = 0; k < 3; ++k)
      weight_and_bias(hf(n.qkv[k]), at + "self_attn.in_proj_", {H, H}, {H}, k * H);
    weight_and_bias(hf(n.out_proj), at + "self_attn.out_proj.", {H, H}, {H});
    weight_and_bias(hf(n.norm1), at + "norm1.", {H}, {H});
    weight_and_bias(hf(n.linear1), at + "linear1.", {F, H}, {F});
    weight_and_bias(hf(n.linear2), at + "linear2.", {H, F}, {H});
    weight_and_bias(hf(n.norm2), at + "norm2.", {H}, {H});
  }
  if (pooler) weight_and_bias("pooler.dense.", "pooler.dense.", {H, H}, {H});
  return m;
}

// Buffers HF saves next to the weights; they hold nothing BertModel needs (positions are computed).
bool is_buffer(const std::string& name) {
  return name == "embeddings.position_ids" || name == "embeddings.token_type_ids";
}

// A task model keeps the encoder under its family's prefix ("bert.", ...); a bare model has none.
std::string encoder_prefix(const TensorList& tensors, const std::string& model_type) {
  const std::string prefix = family_of(model_type, "BertConfig").prefix;
  for (const auto& [name, t] : tensors) {
    if (name == prefix + "embeddings.word_embeddings.weight") return prefix;
  }
  return "";
}

std::string list_names(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += fmt::format(" and {} more", names.size() - shown);
  return s;
}

int64_t get_int(const json& j, const char* key, int64_t fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback == INT64_MIN) fail(fmt::format("{}: '{}' is missing", where, key));
    return fallback;
  }
  if (!it->is_number_integer()) fail(fmt::format("{}: '{}' must be an integer", where, key));
  return it->get<int64_t>();
}

double get_double(const json& j, const char* key, double fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) fail(fmt::format("{}: '{}' must be a number", where, key));
  return it->get<double>();
}

}  // namespace

// ---- config ----

BertConfig BertConfig::from_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(fmt::format("cannot open {}", path));
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    fail(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
  BertConfig c;
  try {
    c.model_type = j.value("model_type", std::string("bert"));
    const Family& fam = family_of(c.model_type, path);
    const ConfigKeys& k = fam.keys;
    c.vocab_size = get_int(j, "vocab_size", INT64_MIN, path);
    c.hidden_size = get_int(j, k.hidden_size, INT64_MIN, path);
    c.num_hidden_layers = get_int(j, k.num_hidden_layers, INT64_MIN, path);
    c.num_attention_heads = get_int(j, k.num_attention_heads, INT64_MIN, path);
    c.intermediate_size = get_int(j, k.intermediate_size, INT64_MIN, path);
    c.max_position_embeddings = get_int(j, "max_position_embeddings", 512, path);
    c.type_vocab_size = fam.token_types ? get_int(j, "type_vocab_size", 2, path) : 0;
    c.pad_token_id = get_int(j, "pad_token_id", fam.pad_token_id, path);
    c.hidden_act = j.value(k.hidden_act, std::string("gelu"));
    c.hidden_dropout_prob = get_double(j, k.hidden_dropout_prob, 0.1, path);
    c.attention_probs_dropout_prob = get_double(j, k.attention_probs_dropout_prob, 0.1, path);
    if (c.model_type == "distilbert") {
      c.layer_norm_eps = 1e-12;  // DistilBERT's LayerNorms have it written into the model
    } else {
      c.layer_norm_eps = j.value("layer_norm_eps", 1e-12);
      const std::string pos = j.value("position_embedding_type", std::string("absolute"));
      if (pos != "absolute") {
        fail(fmt::format("{}: position_embedding_type '{}' is not supported (absolute only)", path,
                         pos));
      }
      if (j.value("is_decoder", false)) fail(fmt::format("{}: is_decoder is not supported", path));
      if (j.value("add_cross_attention", false)) {
        fail(fmt::format("{}: add_cross_attention is not supported", path));
      }
    }
  } catch (const json::exception& e) {
    fail(fmt::format("{}: unexpected layout: {}", path, e.what()));
  }
  c.validate(path);
  return c;
}

void BertConfig::validate(const std::string& where) const {
  const Family& f = family_of(model_type, where);
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                                {"hidden_size", hidden_size},
                                {"num_attention_heads", num_attention_heads},
                                {"intermediate_size", intermediate_size},
                                {"max_position_embeddings", max_position_embeddings}}) {
    if (v <= 0) fail(fmt::format("{}: {} must be > 0, got {}", where, name, v));
  }
  if (f.token_types && type_vocab_size <= 0) {
    fail(fmt::format("{}: type_vocab_size must be > 0, got {}", where, type_vocab_size));
  }
  if (!f.token_types && type_vocab_size != 0) {
    fail(fmt::format("{}: {} has no token types; type_vocab_size must be 0, got {}", where,
                     model_type, type_vocab_size));
  }
  if (num_hidden_layers < 0) fail(fmt::format("{}: num_hidden_layers must be >= 0", where));
  if (hidden_size % num_attention_heads != 0) {
    fail(fmt::format("{}: hidden_size {} is not a multiple of num_attention_heads {}", where,
                     hidden_size, num_attention_heads));
  }
  if (!(layer_norm_eps > 0) || !std::isfinite(layer_norm_eps)) {
    fail(fmt::format("{}: layer_norm_eps must be > 0", where));
  }
  for (const auto& [key, p] :
       {std::pair<const char*, double>{f.keys.hidden_dropout_prob, hidden_dropout_prob},
        {f.keys.attention_probs_dropout_prob, attention_probs_dropout_prob}}) {
    if (!(p >= 0.0 && p < 1.0))
      fail(fmt::format("{}: {} must be in [0, 1), got {}", where, key, p));
  }
  if (f.positions_from_pad && (pad_token_id < 0 || pad_token_id + 1 >= max_position_embeddings)) {
    fail(
        fmt::format("{}: {} counts positions from pad_token_id + 1, so pad_token_id {} must be in "
                    "[0, max_position_embeddings - 1 = {})",
                    where, model_type, pad_token_id, max_position_embeddings - 1));
  }
  activation_of(hidden_act, model_type == "distilbert" ? "activation" : "hidden_act");
}

// ---- the network, under attn's names ----

BertModel::Net::Net(const BertConfig& c, bool pooler, DType dt)
    : word(c.vocab_size, c.hidden_size,
           c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size ? c.pad_token_id : -1, dt),
      position(c.max_position_embeddings, c.hidden_size, -1, dt),
      norm(c.hidden_size, c.layer_norm_eps, true, true, dt),
      embeddings_dropout(c.hidden_dropout_prob) {
  register_module("embeddings.word_embeddings", word);
  register_module("embeddings.position_embeddings", position);
  if (c.type_vocab_size > 0) {
    token_type = std::make_unique<nn::Embedding>(c.type_vocab_size, c.hidden_size, -1, dt);
    register_module("embeddings.token_type_embeddings", *token_type);
  }
  register_module("embeddings.LayerNorm", norm);
  register_module("embeddings.dropout", embeddings_dropout);  // no parameters
  nn::TransformerLayerOptions o;
  o.d_model = c.hidden_size;
  o.nhead = c.num_attention_heads;
  o.dim_feedforward = c.intermediate_size;
  // HF's dropout sites (training mode only): the attention weights, each sublayer's output before
  // its residual add (DistilBERT: the feed-forward's only), none inside the feed-forward.
  o.dropout = 0.0;
  o.attention_dropout = c.attention_probs_dropout_prob;
  o.attention_output_dropout =
      family_of(c.model_type, "BertConfig").attention_output_dropout ? c.hidden_dropout_prob : 0.0;
  o.ffn_output_dropout = c.hidden_dropout_prob;
  o.activation = activation_of(c.hidden_act, "hidden_act");
  o.layer_norm_eps = c.layer_norm_eps;
  o.batch_first = true;
  o.norm_first = false;  // all three are post-norm: x = LN(x + sublayer(x))
  o.dtype = dt;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layers.push_back(std::make_unique<nn::TransformerEncoderLayer>(o));
    register_module(fmt::format("encoder.layer.{}", l), *layers.back());
  }
  if (pooler) {
    dense = std::make_unique<nn::Linear>(c.hidden_size, c.hidden_size, true, dt);
    register_module("pooler.dense", *dense);
  }
  eval();
}

BertModel::BertModel(const BertConfig& config, bool add_pooling_layer, DType dtype)
    : config_(config), pooler_(add_pooling_layer), dtype_(dtype) {
  config_.validate("BertConfig");
  if (dtype != DType::f32 && dtype != DType::bf16) {
    fail(fmt::format("dtype must be f32 or bf16, got {}", dtype_name(dtype)));
  }
  net_ = std::make_unique<Net>(config_, pooler_, dtype_);
}
BertModel::~BertModel() = default;
BertModel::BertModel(BertModel&&) noexcept = default;
BertModel& BertModel::operator=(BertModel&&) noexcept = default;

BertModel BertModel::from_pretrained(const std::string& dir, DType dtype) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(fmt::format("{} is not a folder", dir));
  if (!fs::exists(d / "config.json")) fail(fmt::format("{} has no config.json", dir));
  return from_pretrained(dir, BertConfig::from_json_file((d / "config.json").string()), dtype);
}

BertModel BertModel::from_pretrained(const std::string& dir, const BertConfig& c, DType dtype) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(fmt::format("{} is not a folder", dir));
  const fs::path weights = d / "model.safetensors";
  if (!fs::exists(weights)) {
    if (fs::exists(d / "pytorch_model.bin")) {
      fail(
          fmt::format("{} has pytorch_model.bin but no model.safetensors; attn reads safetensors "
                      "only (save_pretrained(..., safe_serialization=True) writes it)",
                      dir));
    }
    fail(fmt::format("{} has no model.safetensors", dir));
  }
  const detail::CheckpointLoadScope load_scope;
  const TensorList tensors = read_safetensors(weights.string());
  const std::string prefix = encoder_prefix(tensors, c.model_type);
  bool pooler = false;
  for (const auto& [name, t] : tensors) {
    if (name.rfind(prefix + "pooler.", 0) == 0) pooler = true;
  }
  // Every parameter comes from the checkpoint (net_state refuses a missing one): no random
  // initialisation (0.6 s for MiniLM), and the net is loaded in place (a failure discards the model).
  BertModel m = [&] {
    const nn::SkipInit skip;
    return BertModel(c, pooler, dtype);
  }();
  m.net_->load_state_dict(m.net_state(tensors), /*strict=*/true);
  return m;
}

void BertModel::load_safetensors(const std::string& path) {
  const detail::CheckpointLoadScope load_scope;
  load_hf_state_dict(read_safetensors(path));
}

void BertModel::load_hf_state_dict(const TensorList& tensors) {
  const TensorList state = net_state(tensors);
  // Loaded into a fresh network that only then replaces the current one: a failure leaves the model
  // as it was. A strict load overwrites every parameter: nothing to initialise first.
  auto fresh = [&] {
    const nn::SkipInit skip;
    return std::make_unique<Net>(config_, pooler_, dtype_);
  }();
  fresh->load_state_dict(state, /*strict=*/true);
  net_ = std::move(fresh);
}

TensorList BertModel::net_state(const TensorList& tensors) const {
  const std::string prefix = encoder_prefix(tensors, config_.model_type);
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> extra;
  for (const auto& [name, t] : tensors) {
    if (name.rfind(prefix, 0) != 0) continue;  // a task head outside "bert." (...)
    const std::string local = name.substr(prefix.size());
    if (is_buffer(local)) continue;
    if (!given.emplace(local, &t).second) extra.push_back(name + " (twice)");
  }
  const std::vector<NameMap> map = name_map(config_, pooler_);
  std::set<std::string> expected;
  std::vector<std::string> missing, misshapen;
  for (const NameMap& e : map) {
    expected.insert(e.hf);
    const auto it = given.find(e.hf);
    if (it == given.end()) {
      missing.push_back(prefix + e.hf);
    } else if (it->second->shape() != e.shape) {
      misshapen.push_back(fmt::format("{} is {}, expected {}", prefix + e.hf,
                                      it->second->shape_str(), shape_to_string(e.shape)));
    } else if (!is_floating(it->second->dtype())) {
      misshapen.push_back(fmt::format("{} is {}, expected a floating dtype", prefix + e.hf,
                                      dtype_name(it->second->dtype())));
    }
  }
  for (const auto& [name, t] : given) {
    if (!expected.count(name)) extra.push_back(prefix + name);
  }
  if (!missing.empty() || !extra.empty() || !misshapen.empty()) {
    std::string msg = "the checkpoint does not fit the config";
    if (!missing.empty())
      msg += fmt::format("; missing {}: {}", missing.size(), list_names(missing));
    if (!extra.empty()) msg += fmt::format("; unexpected {}: {}", extra.size(), list_names(extra));
    if (!misshapen.empty()) {
      msg += fmt::format("; wrong shape {}: {}", misshapen.size(), list_names(misshapen));
    }
    fail(msg + " (nothing was loaded)");
  }

  // attn's state dict, q, k and v stacked into in_proj.
  std::map<std::string, Tensor> assembled;
  std::vector<std::string> order;
  for (const NameMap& e : map) {
    const Tensor& src = *given.at(e.hf);
    if (e.row < 0) {
      assembled[e.attn] = src.to(DType::f32);
      order.push_back(e.attn);
      continue;
    }
    auto it = assembled.find(e.attn);
    if (it == assembled.end()) {
      Shape full = e.shape;
      full[0] *= 3;
      it = assembled.emplace(e.attn, Tensor::zeros(full, DType::f32)).first;
      order.push_back(e.attn);
    }
    it->second.slice(0, e.row, e.row + e.shape[0]).copy_from(src);
  }
  TensorList state;
  for (const std::string& n : order) state.emplace_back(n, assembled.at(n));
  return state;
}

TensorList BertModel::hf_state_dict() const {
  std::map<std::string, Tensor> attn;
  for (auto& [name, t] : net_->state_dict()) attn[name] = t;
  TensorList out;
  for (const NameMap& e : name_map(config_, pooler_)) {
    const Tensor& t = attn.at(e.attn);
    out.emplace_back(e.hf, e.row < 0 ? t.clone() : t.slice(0, e.row, e.row + e.shape[0]).clone());
  }
  return out;
}

// ---- forward ----

namespace {

// [B, L] integer ids as int64, checked against [0, limit).
Tensor ids_as_i64(const Tensor& t, int64_t limit, const char* what, const Shape& shape) {
  if (t.dtype() != DType::i64 && t.dtype() != DType::i32) {
    fail(fmt::format("forward: {} must be i32 or i64, got {}", what, dtype_name(t.dtype())));
  }
  if (t.shape() != shape) {
    fail(
        fmt::format("forward: {} must be {}, got {}", what, shape_to_string(shape), t.shape_str()));
  }
  Tensor out = t.to(DType::i64);
  const int64_t* p = out.data_as<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (p[i] < 0 || p[i] >= limit) {
      fail(fmt::format("forward: {} holds {} at flat index {}, outside [0, {})", what, p[i], i,
                       limit));
    }
  }
  return out;
}

// [B, L] position ids of validated i64 ids: 0..L-1, or RoBERTa's (see Family::positions_from_pad),
// each checked against max_position_embeddings.
Tensor position_ids_of(const Tensor& ids, const BertConfig& c, bool from_pad) {
  const int64_t B = ids.size(0), L = ids.size(1);
  if (!from_pad && L > c.max_position_embeddings) {
    fail(fmt::format("forward: {} tokens exceed max_position_embeddings {}", L,
                     c.max_position_embeddings));
  }
  Tensor positions = Tensor::empty({B, L}, DType::i64);
  const int64_t* id = ids.data_as<int64_t>();
  int64_t* pos = positions.data_as<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t seen = 0;  // tokens of row b so far that are not pad_token_id
    for (int64_t i = 0; i < L; ++i) {
      const int64_t k = b * L + i;
      if (!from_pad) {
        pos[k] = i;
      } else {
        seen += id[k] != c.pad_token_id;
        pos[k] = id[k] == c.pad_token_id ? c.pad_token_id : c.pad_token_id + seen;
      }
    }
    if (from_pad && c.pad_token_id + seen >= c.max_position_embeddings) {
      fail(fmt::format(
          "forward: row {} has {} tokens that are not pad_token_id {}; {} numbers them from {}, "
          "so at most {} fit max_position_embeddings {}",
          b, seen, c.pad_token_id, c.model_type, c.pad_token_id + 1,
          c.max_position_embeddings - c.pad_token_id - 1, c.max_position_embeddings));
    }
  }
  return positions;
}

}  // namespace

BertOutput BertModel::forward(const Tensor& input_ids, const Tensor& attention_mask,
                              const Tensor& token_type_ids, bool output_attentions) {
  if (!input_ids.defined() || input_ids.dim() != 2) {
    fail(fmt::format("forward: input_ids must be [B, L], got {}",
                     input_ids.defined() ? input_ids.shape_str() : "undefined"));
  }
  const int64_t B = input_ids.size(0), L = input_ids.size(1), H = config_.hidden_size;
  const Tensor ids = ids_as_i64(input_ids, config_.vocab_size, "input_ids", {B, L});
  const Family& f = family_of(config_.model_type, "BertConfig");
  Tensor types;
  if (f.token_types) {
    types = token_type_ids.defined()
                ? ids_as_i64(token_type_ids, config_.type_vocab_size, "token_type_ids", {B, L})
                : Tensor::zeros({B, L}, DType::i64);
  } else if (token_type_ids.defined()) {
    // A WordPiece tokenizer gives token_type_ids anyway; all 0 means "no token types".
    const Tensor t = ids_as_i64(token_type_ids, INT64_MAX, "token_type_ids", {B, L});
    const int64_t* p = t.data_as<int64_t>();
    if (std::any_of(p, p + t.numel(), [](int64_t v) { return v != 0; })) {
      fail(fmt::format("forward: {} has no token types; token_type_ids must be all 0 or not given",
                       config_.model_type));
    }
  }
  const Tensor positions = position_ids_of(ids, config_, f.positions_from_pad);

  nn::EncoderMasks masks;
  masks.need_weights = output_attentions;
  if (attention_mask.defined()) {
    if (attention_mask.shape() != Shape{B, L}) {
      fail(fmt::format("forward: attention_mask must be [{}, {}], got {}", B, L,
                       attention_mask.shape_str()));
    }
    // HF's 1 = real token becomes nn's true = padding.
    Tensor pad = Tensor::empty({B, L}, DType::boolean);
    const std::vector<double> m = attention_mask.to_vector();
    auto* p = pad.data_as<bool>();
    for (size_t i = 0; i < m.size(); ++i) p[i] = m[i] == 0;
    masks.src_key_padding_mask = pad;
  }

  Net& n = *net_;
  // Inference keeps nothing for a backward: each module's activations go back to the buffer cache
  // (core/storage_cache.h) as soon as its forward returns, for the next one. Freed only at the end,
  // the twelve layers of BERT-base at 32 x 128 in f32 held ~2 GB, over the cache's budget: the next
  // call page-faulted ~650 thousand fresh pages (6.2 s against 3.5 s, settling over ten calls on a
  // Zen 4).
  // Training keeps every module's cache for backward (bert_train.cc).
  const bool keep = n.is_training() && nn::grad_enabled();
  std::optional<nn::NoGradGuard> no_grad;
  if (!keep) no_grad.emplace();
  n.cached = false;
  // The three embeddings summed in f32 (bf16: widened first; the LayerNorm takes the f32 sum).
  Tensor x = nn::detail::convert(n.word.forward(ids), DType::f32);  // [B, L, H]
  const Tensor pe = nn::detail::convert(n.position.forward(positions), DType::f32);
  {
    float* px = x.data_as<float>();
    const float* pp = pe.data_as<float>();
    if (n.token_type) {
      const Tensor te = nn::detail::convert(n.token_type->forward(types), DType::f32);
      const float* pt = te.data_as<float>();
      for (int64_t i = 0; i < B * L * H; ++i) px[i] = px[i] + pt[i] + pp[i];  // HF's order
    } else {
      for (int64_t i = 0; i < B * L * H; ++i) px[i] = px[i] + pp[i];
    }
  }
  x = n.embeddings_dropout.forward(n.norm.forward(x));
  BertOutput out;
  for (auto& layer : n.layers) {
    x = layer->forward(x, masks);
    if (output_attentions) out.attentions.push_back(layer->attention_weights().contiguous());
  }
  out.last_hidden_state = x.contiguous();
  if (n.dense) {
    Tensor first = out.last_hidden_state.select(1, 0).contiguous();  // [B, H]: the [CLS] token
    Tensor pooled = nn::detail::convert(n.dense->forward(first), DType::f32);
    float* p = pooled.data_as<float>();
    for (int64_t i = 0; i < pooled.numel(); ++i) p[i] = std::tanh(p[i]);
    out.pooler_output = nn::detail::convert(pooled, dtype_);
    if (keep) n.pooled = pooled;
  }
  if (keep) n.hidden_shape = out.last_hidden_state.shape(), n.cached = true;
  return out;
}

Tensor BertModel::position_ids(const Tensor& input_ids) const {
  if (!input_ids.defined() || input_ids.dim() != 2) {
    fail(fmt::format("position_ids: input_ids must be [B, L], got {}",
                     input_ids.defined() ? input_ids.shape_str() : "undefined"));
  }
  const Tensor ids = ids_as_i64(input_ids, config_.vocab_size, "input_ids", input_ids.shape());
  return position_ids_of(ids, config_,
                         family_of(config_.model_type, "BertConfig").positions_from_pad);
}

}  // namespace attn::models
