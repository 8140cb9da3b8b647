// attn::models::BertModel: a HuggingFace BERT-family encoder (BERT, MiniLM) assembled from
// attn::nn, loaded from a folder with config.json + model.safetensors, computing what transformers'
// BertModel computes in eval mode.
//
//   x = LayerNorm(word[ids] + position[0..L) + token_type[type_ids])              [B, L, H]
//   x = TransformerEncoderLayer(x)  (post-norm, GELU, layer_norm_eps) x N           [B, L, H]
//   pooler_output = tanh(dense(x[:, 0]))  (when the checkpoint has a pooler)       [B, H]
//   attentions[l] = softmax weights of layer l (output_attentions)                 [B, heads, L, L]
//
// Padding: attention_mask [B, L] (nonzero = a real token, 0 = padding, as HF) removes padded keys;
// padded positions still get an output (they attend to the real tokens), as in HF. A row with no
// real token at all gives zeros (attn's fully-masked rule) where HF averages uniformly.
//
// Loading is strict and all-or-nothing: every tensor the config implies must be present with its
// shape, and no other tensor may be there, except the position_ids / token_type_ids buffers and,
// in a checkpoint of a task model whose encoder sits under "bert.", the task head's tensors outside
// it. Any failure throws attn::Error naming the tensors, and the model is left as it was.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/io.h"
#include "attn/tensor.h"

namespace attn::models {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";  // gelu (erf), gelu_new / gelu_pytorch_tanh (tanh), relu, silu
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  std::string model_type = "bert";

  // Reads a HuggingFace config.json; refuses (attn::Error naming the file and the field) anything
  // this model cannot run: another model_type, position_embedding_type other than "absolute", a
  // decoder or cross-attention, an unknown hidden_act, hidden_size not divisible by the heads.
  static BertConfig from_json_file(const std::string& path);
  void validate(const std::string& where) const;
};

struct BertOutput {
  Tensor last_hidden_state;        // [B, L, H] f32
  Tensor pooler_output;            // [B, H] f32; undefined without a pooler
  std::vector<Tensor> attentions;  // per layer [B, heads, L, L] f32, when asked
};

class BertModel {
 public:
  // Random weights (attn::nn's initialisers), for tests and for building checkpoints.
  explicit BertModel(const BertConfig& config, bool add_pooling_layer = true);
  ~BertModel();
  BertModel(BertModel&&) noexcept;
  BertModel& operator=(BertModel&&) noexcept;

  // config.json + model.safetensors; the pooler is there when the checkpoint has one.
  static BertModel from_pretrained(const std::string& dir);
  // Strict loads of HF-named tensors (see above); on any error nothing changes.
  void load_hf_state_dict(const TensorList& tensors);
  void load_safetensors(const std::string& path);
  // The weights under HF's names (query/key/value split out of attn's in_proj), copies.
  TensorList hf_state_dict() const;

  // input_ids [B, L] (i32 / i64); attention_mask [B, L] (any dtype, nonzero = real token) and
  // token_type_ids [B, L] optional (undefined = all real / all 0).
  BertOutput forward(const Tensor& input_ids, const Tensor& attention_mask = {},
                     const Tensor& token_type_ids = {}, bool output_attentions = false);

  const BertConfig& config() const { return config_; }
  bool has_pooler() const { return pooler_; }

 private:
  struct Net;
  BertConfig config_;
  bool pooler_;
  std::unique_ptr<Net> net_;
};

}  // namespace attn::models
