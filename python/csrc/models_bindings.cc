// attn._core.models: the pretrained BERT-family encoder, its WordPiece tokenizer and the
// sentence-transformers encoder (include/attn/models/*.h), for the pure-Python attn.models, which
// gives them HuggingFace's call signatures. Every computation runs with the GIL released; a model
// holds a mutex because its forward reuses the module's buffers (two Python threads may share one).
// write_heads_report is attn::viz::write_model_report (the report of `attn viz
// --model`).
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "arrays.h"
#include "attn/models/bert.h"
#include "attn/models/sentence.h"
#include "attn/models/tokenizer.h"
#include "attn/viz/model_report.h"
#include "bindings.h"
#include "nn_parameters.h"

namespace attn::python {

namespace {

using namespace attn::models;
using StringList = std::vector<std::string>;

struct TokenizerHolder {
  WordPieceTokenizer tok;
};

struct BertHolder {
  BertModel model;
  std::mutex mu;
};

struct SentenceHolder {
  SentenceEncoder enc;
  std::mutex mu;
};

// A padded batch [B, L] as HF pads it: ids with [PAD], attention_mask 1 = real token,
// token_type_ids 0 in the padding; L is the longest encoding, at least min_length, rounded up to
// a multiple of pad_to_multiple_of (when > 0). padding_side "left" puts the padding first.
std::tuple<Tensor, Tensor, Tensor> pad_batch(const std::vector<Encoding>& enc, int64_t pad_id,
                                             int64_t min_length, int64_t pad_to_multiple_of,
                                             bool left) {
  int64_t L = std::max<int64_t>(min_length, 0);
  for (const Encoding& e : enc) L = std::max(L, static_cast<int64_t>(e.ids.size()));
  if (pad_to_multiple_of > 0 && L % pad_to_multiple_of != 0)
    L += pad_to_multiple_of - L % pad_to_multiple_of;
  const auto B = static_cast<int64_t>(enc.size());
  Tensor ids = Tensor::full({B, L}, static_cast<double>(pad_id), DType::i64);
  Tensor mask = Tensor::zeros({B, L}, DType::i64);
  Tensor types = Tensor::zeros({B, L}, DType::i64);
  for (int64_t b = 0; b < B; ++b) {
    const Encoding& e = enc[static_cast<size_t>(b)];
    const auto n = static_cast<int64_t>(e.ids.size());
    const int64_t start = b * L + (left ? L - n : 0);
    for (int64_t j = 0; j < n; ++j) {
      ids.data_as<int64_t>()[start + j] = e.ids[static_cast<size_t>(j)];
      mask.data_as<int64_t>()[start + j] = 1;
      types.data_as<int64_t>()[start + j] = e.type_ids[static_cast<size_t>(j)];
    }
  }
  return {std::move(ids), std::move(mask), std::move(types)};
}

nb::dict config_dict(const BertConfig& c) {
  nb::dict d;
  d["model_type"] = c.model_type;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["intermediate_size"] = c.intermediate_size;
  d["hidden_act"] = c.hidden_act;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["type_vocab_size"] = c.type_vocab_size;
  d["layer_norm_eps"] = c.layer_norm_eps;
  d["pad_token_id"] = c.pad_token_id;
  d["hidden_dropout_prob"] = c.hidden_dropout_prob;
  d["attention_probs_dropout_prob"] = c.attention_probs_dropout_prob;
  return d;
}

// WordPieceTokenizer: the tokenizer of attn.models.Tokenizer.
void bind_tokenizer(nb::module_& m) {
  nb::class_<TokenizerHolder>(m, "WordPieceTokenizer")
      .def_static(
          "from_folder",
          [](const std::string& dir) {
            return new TokenizerHolder{WordPieceTokenizer::from_folder(dir)};
          },
          nb::arg("path"),
          "A HuggingFace folder: tokenizer.json (+ tokenizer_config.json), or vocab.txt + "
          "tokenizer_config.json.")
      .def(
          "encode",
          [](const TokenizerHolder& h, const std::string& text, int64_t max_length,
             bool add_special_tokens) {
            Encoding e;
            {
              nb::gil_scoped_release release;
              e = h.tok.encode(text, max_length, add_special_tokens);
            }
            return std::make_tuple(e.ids, e.type_ids, e.tokens);
          },
          nb::arg("text"), nb::arg("max_length") = -1, nb::arg("add_special_tokens") = true,
          nb::sig("def encode(self, text: str, max_length: int = -1, add_special_tokens: bool = "
                  "True) -> tuple[list[int], list[int], list[str]]"),
          "One text -> (ids, token_type_ids, tokens). max_length: tokens of the result, special "
          "ones included; -1 = the model's model_max_length, 0 = no truncation.")
      .def(
          "encode_batch",
          [](const TokenizerHolder& h, const StringList& texts, int64_t max_length,
             bool add_special_tokens, int64_t min_length, int64_t pad_to_multiple_of,
             const std::string& padding_side) {
            if (padding_side != "right" && padding_side != "left") {
              throw nb::value_error(
                  fmt::format("attn.models.Tokenizer: padding_side must be 'right' or 'left', got "
                              "'{}'",
                              padding_side)
                      .c_str());
            }
            std::tuple<Tensor, Tensor, Tensor> r;
            {
              nb::gil_scoped_release release;
              std::vector<Encoding> enc;
              enc.reserve(texts.size());
              for (const std::string& t : texts)
                enc.push_back(h.tok.encode(t, max_length, add_special_tokens));
              r = pad_batch(enc, h.tok.pad_id(), min_length, pad_to_multiple_of,
                            padding_side == "left");
            }
            return nb::make_tuple(export_tensor(std::move(std::get<0>(r)), false),
                                  export_tensor(std::move(std::get<1>(r)), false),
                                  export_tensor(std::move(std::get<2>(r)), false));
          },
          nb::arg("texts"), nb::arg("max_length") = -1, nb::arg("add_special_tokens") = true,
          nb::arg("min_length") = 0, nb::arg("pad_to_multiple_of") = 0,
          nb::arg("padding_side") = "right",
          nb::sig("def encode_batch(self, texts: list[str], max_length: int = -1, "
                  "add_special_tokens: bool = True, min_length: int = 0, pad_to_multiple_of: int "
                  "= 0, padding_side: str = 'right') -> tuple[Any, Any, Any]"),
          "texts -> (input_ids, attention_mask, token_type_ids), int64 NumPy arrays [B, L] padded "
          "with [PAD] to the longest encoding (at least min_length, rounded up to a multiple of "
          "pad_to_multiple_of). max_length as in encode.")
      .def(
          "token_to_id",
          [](const TokenizerHolder& h, const std::string& t) { return h.tok.token_to_id(t); },
          nb::arg("token"), "-1 when the token is not in the vocabulary.")
      .def(
          "id_to_token",
          [](const TokenizerHolder& h, int64_t id) {
            if (id < 0 || id >= h.tok.vocab_size()) {
              throw nb::index_error(fmt::format("attn.models.Tokenizer: id {} is outside [0, {})",
                                                id, h.tok.vocab_size())
                                        .c_str());
            }
            return h.tok.id_to_token(id);
          },
          nb::arg("id"))
      .def_prop_ro("vocab_size", [](const TokenizerHolder& h) { return h.tok.vocab_size(); })
      .def_prop_ro("pad_token_id", [](const TokenizerHolder& h) { return h.tok.pad_id(); })
      .def_prop_ro("pad_token", [](const TokenizerHolder& h) { return h.tok.config().pad_token; })
      .def_prop_ro("unk_token", [](const TokenizerHolder& h) { return h.tok.config().unk_token; })
      .def_prop_ro(
          "model_max_length",
          [](const TokenizerHolder& h) { return h.tok.config().model_max_length; },
          "Truncation length of the folder (0 = none).");
}

// Fine-tuning (attn/models/bert.h): train / eval, backward, parameters for an optimizer.
void bind_bert_training(nb::class_<BertHolder>& bert) {
  bert.def(
          "train",
          [](BertHolder& h, bool on) {
            std::lock_guard<std::mutex> lock(h.mu);
            h.model.train(on);
          },
          nb::arg("mode") = true)
      .def_prop_ro("training", [](const BertHolder& h) { return h.model.is_training(); })
      .def(
          "backward",
          [](BertHolder& h, nb::handle d_hidden, nb::handle d_pooler) {
            ArrayScope scope("attn.models.BertModel.backward");
            const Tensor dh = scope.import(d_hidden, "grad_last_hidden_state", true);
            const Tensor dp = scope.import(d_pooler, "grad_pooler_output", true);
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(h.mu);
            h.model.backward(dh, dp);
          },
          nb::arg("grad_last_hidden_state").none() = nb::none(),
          nb::arg("grad_pooler_output").none() = nb::none())
      .def(
          "parameters",
          [](const BertHolder& h, const std::string& prefix) {
            ParameterList l{h.model.named_parameters()};
            if (!prefix.empty())
              for (nn::NamedParameter& p : l.items) p.name = prefix + "." + p.name;
            return l;
          },
          nb::arg("prefix") = "")
      .def("zero_grad",
           [](BertHolder& h) {
             std::lock_guard<std::mutex> lock(h.mu);
             h.model.zero_grad();
           })
      .def(
          "manual_seed",
          [](BertHolder& h, uint64_t seed) {
            std::lock_guard<std::mutex> lock(h.mu);
            h.model.manual_seed(seed);
          },
          nb::arg("seed"));
}

// The forward and the weights under HF's names.
void bind_bert_inference(nb::class_<BertHolder>& bert) {
  bert.def(
          "forward",
          [](BertHolder& h, nb::handle input_ids, nb::handle attention_mask,
             nb::handle token_type_ids, bool output_attentions) {
            ArrayScope scope("attn.models.BertModel");
            const Tensor ids = scope.import(input_ids, "input_ids");
            const Tensor mask = scope.import(attention_mask, "attention_mask", true);
            const Tensor types = scope.import(token_type_ids, "token_type_ids", true);
            BertOutput o;
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(h.mu);
              o = h.model.forward(ids, mask, types, output_attentions);
            }
            const bool torch = scope.torch();
            nb::list att;
            for (Tensor& a : o.attentions) att.append(export_tensor(std::move(a), torch));
            return nb::make_tuple(export_tensor(std::move(o.last_hidden_state), torch),
                                  export_tensor(std::move(o.pooler_output), torch), nb::tuple(att));
          },
          nb::arg("input_ids"), nb::arg("attention_mask").none() = nb::none(),
          nb::arg("token_type_ids").none() = nb::none(), nb::arg("output_attentions") = false,
          nb::sig(
              "def forward(self, input_ids: ArrayLike, attention_mask: ArrayLike | None = None, "
              "token_type_ids: ArrayLike | None = None, output_attentions: bool = False) -> "
              "tuple[Any, Any, tuple[Any, ...]]"),
          "input_ids [B, L] (int32 / int64), attention_mask [B, L] (nonzero = real token), "
          "token_type_ids [B, L] -> (last_hidden_state [B, L, H], pooler_output [B, H] or None, "
          "attentions: one [B, heads, L, L] per layer when output_attentions, else ()), float32 "
          "(a bf16 model: bf16 torch tensors, float32 NumPy arrays of bf16 values; attentions "
          "float32), torch tensors when any input was one.")
      .def(
          "load_state_dict",
          [](BertHolder& h, nb::dict sd) {
            ArrayScope scope("attn.models.BertModel.load_state_dict");
            TensorList list;
            for (auto [k, v] : sd) {
              if (!nb::isinstance<nb::str>(k))
                throw nb::type_error("attn.models.BertModel.load_state_dict: keys must be str");
              const std::string name = nb::cast<std::string>(k);
              list.emplace_back(name, scope.import(v, name.c_str()));
            }
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(h.mu);
            h.model.load_hf_state_dict(list);
          },
          nb::arg("state_dict"),
          "HF-named tensors, strict and all-or-nothing: on any error the model is unchanged.")
      .def(
          "load_safetensors",
          [](BertHolder& h, const std::string& path) {
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(h.mu);
            h.model.load_safetensors(path);
          },
          nb::arg("path"), "As load_state_dict, from a .safetensors file.")
      .def(
          "state_dict",
          [](BertHolder& h) {
            TensorList list;
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(h.mu);
              list = h.model.hf_state_dict();
            }
            nb::dict d;
            for (auto& [name, t] : list) d[name.c_str()] = export_tensor(std::move(t), false);
            return d;
          },
          "The weights under HF's names, as NumPy copies.")
      .def_prop_ro("config", [](const BertHolder& h) { return config_dict(h.model.config()); })
      .def_prop_ro("has_pooler", [](const BertHolder& h) { return h.model.has_pooler(); });
}

// BertModel: loading, then fine-tuning, then the forward and the weights.
void bind_bert(nb::module_& m) {
  nb::class_<BertHolder> bert(m, "BertModel");
  bert.def_static(
          "from_pretrained",
          [](const std::string& dir, const std::string& dtype, std::optional<double> hidden,
             std::optional<double> attention) {
            const DType dt = parse_dtype(dtype);
            BertModel model = [&] {
              nb::gil_scoped_release release;
              if (!hidden && !attention) return BertModel::from_pretrained(dir, dt);
              const std::string json = dir + "/config.json";
              if (!std::filesystem::exists(json)) return BertModel::from_pretrained(dir, dt);
              BertConfig c = BertConfig::from_json_file(json);
              c.hidden_dropout_prob = hidden.value_or(c.hidden_dropout_prob);
              c.attention_probs_dropout_prob = attention.value_or(c.attention_probs_dropout_prob);
              return BertModel::from_pretrained(dir, c, dt);
            }();
            return new BertHolder{std::move(model), {}};
          },
          nb::arg("path"), nb::arg("dtype") = "float32",
          nb::arg("hidden_dropout_prob").none() = nb::none(),
          nb::arg("attention_probs_dropout_prob").none() = nb::none(),
          "config.json + model.safetensors of a HuggingFace folder of model_type bert (MiniLM "
          "too), roberta or distilbert; strict (every tensor the config implies, with its shape, "
          "and no other), all-or-nothing. dtype 'float32' or 'bfloat16' (inference in bf16: bf16 "
          "weights and activations, f32 accumulation and LayerNorm / softmax statistics). The "
          "dropout probabilities, when given, replace the config's (training mode only).")
      .def_prop_ro(
          "dtype", [](const BertHolder& h) { return std::string(dtype_name(h.model.dtype())); },
          "The compute dtype: 'f32' or 'bf16'.");
  bind_bert_training(bert);
  bind_bert_inference(bert);
}

// SentenceEncoder: the sentence-transformers pipeline of attn.models.SentenceTransformer.
void bind_sentence_encoder(nb::module_& m) {
  nb::class_<SentenceHolder>(m, "SentenceEncoder")
      .def_static(
          "from_folder",
          [](const std::string& dir) {
            SentenceEncoder enc = [&] {
              nb::gil_scoped_release release;
              return SentenceEncoder::from_folder(dir);
            }();
            return new SentenceHolder{std::move(enc), {}};
          },
          nb::arg("path"),
          "A sentence-transformers folder: modules.json, sentence_bert_config.json, "
          "1_Pooling/config.json, the model and its tokenizer.")
      .def(
          "encode",
          [](SentenceHolder& h, const StringList& texts, int64_t batch_size) {
            Tensor out;
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(h.mu);
              out = h.enc.encode(texts, batch_size);
            }
            return export_tensor(std::move(out), false);
          },
          nb::arg("texts"), nb::arg("batch_size") = 32,
          nb::sig("def encode(self, texts: list[str], batch_size: int = 32) -> Any"),
          "texts -> [N, D] float32 NumPy embeddings, in the order of texts (run longest first, in "
          "batches of batch_size, as sentence-transformers).")
      .def(
          "tokenize",
          [](const SentenceHolder& h, const StringList& texts) {
            TokenBatch b;
            {
              nb::gil_scoped_release release;
              b = h.enc.tokenize(texts);
            }
            return nb::make_tuple(export_tensor(std::move(b.input_ids), false),
                                  export_tensor(std::move(b.attention_mask), false),
                                  export_tensor(std::move(b.token_type_ids), false));
          },
          nb::arg("texts"),
          "The padded batch (input_ids, attention_mask, token_type_ids) the Transformer module "
          "builds.")
      .def_prop_ro("dimension", [](const SentenceHolder& h) { return h.enc.dimension(); })
      .def_prop_ro("max_seq_length", [](const SentenceHolder& h) { return h.enc.max_seq_length(); })
      .def_prop_ro("normalize", [](const SentenceHolder& h) { return h.enc.normalize(); })
      .def_prop_ro("pooling", [](const SentenceHolder& h) {
        const PoolingModes& p = h.enc.pooling();
        nb::dict d;
        d["cls"] = p.cls;
        d["max"] = p.max;
        d["mean"] = p.mean;
        d["mean_sqrt_len"] = p.mean_sqrt_len;
        return d;
      });
}

// attn::viz::write_model_report, the report of `attn viz --model`.
void bind_heads_report(nb::module_& m) {
  m.def(
      "write_heads_report",
      [](BertHolder& h, const TokenizerHolder& tok, const StringList& texts,
         const std::string& out_dir, const std::string& model_path, const std::string& title) {
        viz::ModelReportOptions o;
        o.model_path = model_path;
        o.title = title;
        viz::ModelReport r;
        {
          nb::gil_scoped_release release;
          std::lock_guard<std::mutex> lock(h.mu);
          r = viz::write_model_report(h.model, tok.tok, texts, out_dir, o);
        }
        nb::dict d;
        d["html"] = r.html;
        d["reports"] = r.reports;
        d["files"] = r.files;
        d["layers"] = r.layers;
        d["heads"] = r.heads;
        d["tokens"] = r.tokens;
        d["entropy"] = r.entropy;
        return d;
      },
      nb::arg("model"), nb::arg("tokenizer"), nb::arg("texts"), nb::arg("out_dir"),
      nb::arg("model_path"), nb::arg("title"),
      nb::sig("def write_heads_report(model: BertModel, tokenizer: WordPieceTokenizer, texts: "
              "list[str], out_dir: str, model_path: str, title: str) -> dict[str, Any]"),
      "attn::viz::write_model_report: report.html and a PNG and SVG per head in out_dir (one "
      "text), or out_dir/text{i}/ per text and out_dir/index.html; everything is computed before "
      "out_dir is created. Returns {html, reports, files, layers, heads, tokens, entropy "
      "[text][layer][head]}.");
}

}  // namespace

void bind_models(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "models", "attn::models: BERT-family encoders and their tokenizer (use attn.models).");
  bind_tokenizer(m);
  bind_bert(m);
  bind_sentence_encoder(m);
  bind_heads_report(m);
}

}  // namespace attn::python
