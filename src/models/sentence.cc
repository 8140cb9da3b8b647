// Sentence embeddings from a sentence-transformers folder (see sentence.h).
#include "attn/models/sentence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "attn/error.h"

namespace attn::models {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& msg) {
  throw Error("attn::models::SentenceEncoder: " + msg);
}

json read_json(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(fmt::format("cannot open {}", p.string()));
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    fail(fmt::format("{} is not valid JSON: {}", p.string(), e.what()));
  }
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

PoolingModes read_pooling(const fs::path& p) {
  const json j = read_json(p);
  PoolingModes m;
  m.mean = false;
  auto set = [&](const std::string& mode) {
    if (mode == "cls") {
      m.cls = true;
    } else if (mode == "max") {
      m.max = true;
    } else if (mode == "mean") {
      m.mean = true;
    } else if (mode == "mean_sqrt_len_tokens") {
      m.mean_sqrt_len = true;
    } else {
      fail(
          fmt::format("{}: pooling mode '{}' is not supported (cls, max, mean, "
                      "mean_sqrt_len_tokens)",
                      p.string(), mode));
    }
  };
  try {
    if (j.contains("pooling_mode") && !j["pooling_mode"].is_null()) {
      const json& pm = j["pooling_mode"];
      if (pm.is_string()) {
        set(pm.get<std::string>());
      } else {
        for (const json& x : pm) set(x.get<std::string>());
      }
    } else {
      static const std::pair<const char*, const char*> legacy[] = {
          {"pooling_mode_cls_token", "cls"},
          {"pooling_mode_max_tokens", "max"},
          {"pooling_mode_mean_tokens", "mean"},
          {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"},
          {"pooling_mode_weightedmean_tokens", "weightedmean"},
          {"pooling_mode_lasttoken", "lasttoken"}};
      for (const auto& [key, mode] : legacy) {
        if (j.value(key, false)) set(mode);
      }
      if (!m.cls && !m.max && !m.mean && !m.mean_sqrt_len)
        m.mean = true;  // as sentence-transformers
    }
  } catch (const json::exception& e) {
    fail(fmt::format("{}: unexpected layout: {}", p.string(), e.what()));
  }
  return m;
}

}  // namespace

SentenceEncoder SentenceEncoder::from_folder(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(fmt::format("{} is not a folder", dir));
  fs::path transformer = d, pooling;
  bool normalize = false, saw_transformer = false;
  if (fs::exists(d / "modules.json")) {
    const json mods = read_json(d / "modules.json");
    try {
      for (const json& m : mods) {
        const std::string type = m.at("type").get<std::string>();
        const std::string path = m.value("path", std::string());
        if (ends_with(type, ".Transformer") && !saw_transformer) {
          transformer = d / path;
          saw_transformer = true;
        } else if (ends_with(type, ".Pooling") && pooling.empty() && saw_transformer) {
          pooling = d / path;
        } else if (ends_with(type, ".Normalize") && !pooling.empty() && !normalize) {
          normalize = true;
        } else {
          fail(
              fmt::format("{}: module '{}' ({}) is not supported; attn runs Transformer -> "
                          "Pooling -> Normalize",
                          (d / "modules.json").string(), m.value("name", std::string()), type));
        }
      }
    } catch (const json::exception& e) {
      fail(fmt::format("{}: unexpected layout: {}", (d / "modules.json").string(), e.what()));
    }
    if (!saw_transformer)
      fail(fmt::format("{}: no Transformer module", (d / "modules.json").string()));
  }
  BertModel model = BertModel::from_pretrained(transformer.string());
  WordPieceTokenizer tok = WordPieceTokenizer::from_folder(transformer.string());
  SentenceEncoder e(std::move(model), std::move(tok));
  e.normalize_ = normalize;
  if (!pooling.empty()) e.modes_ = read_pooling(pooling / "config.json");
  // max_seq_length: sentence_bert_config.json's, else the tokenizer's, capped at the positions.
  int64_t len = e.tokenizer_.config().model_max_length;
  const fs::path sb = transformer / "sentence_bert_config.json";
  if (fs::exists(sb)) {
    const json j = read_json(sb);
    if (j.contains("max_seq_length") && j["max_seq_length"].is_number_integer()) {
      len = j["max_seq_length"].get<int64_t>();
    }
    if (j.value("do_lower_case", false)) {
      fail(fmt::format("{}: do_lower_case true is not supported", sb.string()));
    }
  }
  const int64_t positions = e.model_.config().max_position_embeddings;
  e.max_seq_length_ = len > 0 ? std::min(len, positions) : positions;
  return e;
}

int64_t SentenceEncoder::dimension() const {
  const int64_t H = model_.config().hidden_size;
  return H * (int64_t{modes_.cls} + modes_.max + modes_.mean + modes_.mean_sqrt_len);
}

TokenBatch SentenceEncoder::tokenize(const std::vector<std::string>& texts) const {
  std::vector<Encoding> enc;
  size_t L = 0;
  for (const std::string& t : texts) {
    enc.push_back(tokenizer_.encode(t, max_seq_length_));
    L = std::max(L, enc.back().ids.size());
  }
  const auto B = static_cast<int64_t>(texts.size());
  TokenBatch b;
  b.input_ids = Tensor::full({B, static_cast<int64_t>(L)}, static_cast<double>(tokenizer_.pad_id()),
                             DType::i64);
  b.attention_mask = Tensor::zeros({B, static_cast<int64_t>(L)}, DType::i64);
  b.token_type_ids = Tensor::zeros({B, static_cast<int64_t>(L)}, DType::i64);
  for (size_t i = 0; i < enc.size(); ++i) {
    for (size_t j = 0; j < enc[i].ids.size(); ++j) {
      const size_t k = i * L + j;
      b.input_ids.data_as<int64_t>()[k] = enc[i].ids[j];
      b.attention_mask.data_as<int64_t>()[k] = 1;
      b.token_type_ids.data_as<int64_t>()[k] = enc[i].type_ids[j];
    }
  }
  return b;
}

Tensor SentenceEncoder::pool(const Tensor& hidden, const Tensor& attention_mask) const {
  const int64_t B = hidden.size(0), L = hidden.size(1), H = hidden.size(2), D = dimension();
  const Tensor h = hidden.to(DType::f32);
  const Tensor m = attention_mask.to(DType::i64);
  const float* ph = h.data_as<float>();
  const int64_t* pm = m.data_as<int64_t>();
  Tensor out = Tensor::zeros({B, D}, DType::f32);
  float* po = out.data_as<float>();
  for (int64_t b = 0; b < B; ++b) {
    float* row = po + b * D;
    int64_t n = 0, first = -1;
    for (int64_t i = 0; i < L; ++i) {
      if (pm[b * L + i] != 0) {
        ++n;
        if (first < 0) first = i;
      }
    }
    int64_t off = 0;
    if (modes_.cls) {  // the first real token (index 0 with right padding)
      const int64_t i = first < 0 ? 0 : first;
      for (int64_t d = 0; d < H; ++d) row[off + d] = ph[(b * L + i) * H + d];
      off += H;
    }
    if (modes_.max) {  // padded tokens are -inf
      for (int64_t d = 0; d < H; ++d) {
        float v = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < L; ++i) {
          if (pm[b * L + i] != 0) v = std::max(v, ph[(b * L + i) * H + d]);
        }
        row[off + d] = v;
      }
      off += H;
    }
    if (modes_.mean || modes_.mean_sqrt_len) {
      std::vector<float> sum(static_cast<size_t>(H), 0.0f);
      for (int64_t i = 0; i < L; ++i) {
        if (pm[b * L + i] == 0) continue;
        for (int64_t d = 0; d < H; ++d) sum[d] += ph[(b * L + i) * H + d];
      }
      const float count = std::max(static_cast<float>(n), 1e-9f);  // clamp(min=1e-9)
      if (modes_.mean) {
        for (int64_t d = 0; d < H; ++d) row[off + d] = sum[d] / count;
        off += H;
      }
      if (modes_.mean_sqrt_len) {
        for (int64_t d = 0; d < H; ++d) row[off + d] = sum[d] / std::sqrt(count);
        off += H;
      }
    }
    if (normalize_) {  // F.normalize(p=2): x / max(||x||, 1e-12)
      double norm = 0;
      for (int64_t d = 0; d < D; ++d) norm += static_cast<double>(row[d]) * row[d];
      const float scale = static_cast<float>(1.0 / std::max(std::sqrt(norm), 1e-12));
      for (int64_t d = 0; d < D; ++d) row[d] *= scale;
    }
  }
  return out;
}

Tensor SentenceEncoder::encode(const std::vector<std::string>& texts, int64_t batch_size,
                               const std::function<void(int64_t, int64_t)>& progress) {
  if (batch_size <= 0) fail(fmt::format("encode: batch_size must be > 0, got {}", batch_size));
  const auto N = static_cast<int64_t>(texts.size());
  const int64_t D = dimension();
  Tensor out = Tensor::zeros({N, D}, DType::f32);
  // Longest first, as sentence-transformers (by character count): batches of similar lengths pad
  // little. Each text's embedding does not depend on its batch beyond rounding.
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return texts[static_cast<size_t>(a)].size() > texts[static_cast<size_t>(b)].size();
  });
  for (int64_t start = 0; start < N; start += batch_size) {
    const int64_t stop = std::min(N, start + batch_size);
    std::vector<std::string> batch;
    for (int64_t i = start; i < stop; ++i) batch.push_back(texts[static_cast<size_t>(order[i])]);
    const TokenBatch tb = tokenize(batch);
    const BertOutput o = model_.forward(tb.input_ids, tb.attention_mask, tb.token_type_ids);
    const Tensor pooled = pool(o.last_hidden_state, tb.attention_mask);
    for (int64_t i = start; i < stop; ++i) {
      std::copy_n(pooled.data_as<float>() + (i - start) * D, D,
                  out.data_as<float>() + order[static_cast<size_t>(i)] * D);
    }
    if (progress) progress(stop, N);
  }
  return out;
}

}  // namespace attn::models
