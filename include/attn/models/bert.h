// attn::models::BertModel: a HuggingFace BERT-family encoder (BERT, MiniLM, RoBERTa, DistilBERT)
// assembled from attn::nn, loaded from a folder with config.json + model.safetensors, computing
// what transformers' BertModel / RobertaModel / DistilBertModel computes in eval mode.
//
//   x = LayerNorm(word[ids] + position[pos] + token_type[type_ids])                [B, L, H]
//   x = TransformerEncoderLayer(x)  (post-norm, the config's activation, eps) x N  [B, L, H]
//   pooler_output = tanh(dense(x[:, 0]))  (when the checkpoint has a pooler)       [B, H]
//   attentions[l] = softmax weights of layer l (output_attentions)                 [B, heads, L, L]
//
// The three families run that same network and differ only in (src/models/bert.cc's Family table,
// the one place that holds their tensor names):
//   bert (MiniLM too)  pos = 0..L-1; token types; names under "bert." in task models
//   roberta            pos = pad_token_id + 1 + (rank among the row's ids != pad_token_id), and
//                      pad_token_id at pad ids (HF's create_position_ids_from_input_ids: from the
//                      ids, not the attention_mask); otherwise BERT's names, under "roberta."
//   distilbert         pos = 0..L-1; no token types and no pooler; config keys dim, n_layers,
//                      n_heads, hidden_dim, activation; LayerNorm eps 1e-12; its own names
//                      (transformer.layer.N.attention.q_lin, sa_layer_norm, ffn.lin1, ...)
//
// Padding: attention_mask [B, L] (nonzero = a real token, 0 = padding, as HF) removes padded keys;
// padded positions still get an output (they attend to the real tokens), as in HF. A row with no
// real token at all gives zeros (attn's fully-masked rule) where HF averages uniformly.
//
// Loading is strict and all-or-nothing: every tensor the config implies must be present with its
// shape, and no other tensor may be there, except the position_ids / token_type_ids buffers and,
// in a checkpoint of a task model whose encoder sits under its family's prefix ("bert.",
// "roberta.", "distilbert."), the task head's tensors outside it. Any failure throws attn::Error
// naming the tensors, and the model is left as it was.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/io.h"
#include "attn/nn/module.h"
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
  int64_t type_vocab_size = 2;  // 0 for distilbert (no token types)
  double layer_norm_eps = 1e-12;
  // Dropout in training mode (BertModel::train), each in [0, 1); DistilBERT's config calls them
  // dropout and attention_dropout. hidden: the embeddings' output and each sublayer's output before
  // its residual add (DistilBERT: not the attention's); attention: the attention weights.
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  int64_t pad_token_id = 0;         // RoBERTa's positions count from it
  std::string model_type = "bert";  // bert, roberta, distilbert

  // Reads a HuggingFace config.json (DistilBERT's keys mapped to these); refuses (attn::Error
  // naming the file and the field) anything this model cannot run: another model_type,
  // position_embedding_type other than "absolute", a decoder or cross-attention, an unknown
  // activation, hidden_size not divisible by the heads.
  static BertConfig from_json_file(const std::string& path);
  void validate(const std::string& where) const;
};

// In the model's dtype (f32, or bf16: see BertModel's dtype); attentions are f32 either way.
struct BertOutput {
  Tensor last_hidden_state;        // [B, L, H]
  Tensor pooler_output;            // [B, H]; undefined without a pooler
  std::vector<Tensor> attentions;  // per layer [B, heads, L, L] f32, when asked
};

class BertModel {
 public:
  // Random weights (attn::nn's initialisers), for tests and for building checkpoints.
  // dtype f32 or bf16 (inference as autocast / model.to(torch.bfloat16): bf16 weights and
  // activations, f32 accumulation, LayerNorm and softmax statistics in f32; attn/nn/layers.h).
  explicit BertModel(const BertConfig& config, bool add_pooling_layer = true,
                     DType dtype = DType::f32);
  ~BertModel();
  BertModel(BertModel&&) noexcept;
  BertModel& operator=(BertModel&&) noexcept;

  // config.json + model.safetensors; the pooler is there when the checkpoint has one.
  // The checkpoint's tensors are rounded once to dtype.
  static BertModel from_pretrained(const std::string& dir, DType dtype = DType::f32);
  // The same with `config` in place of the folder's config.json (as transformers'
  // from_pretrained(dir, config=...)): BertConfig::from_json_file, then edited, e.g. its dropout.
  // The checkpoint must fit it as above.
  static BertModel from_pretrained(const std::string& dir, const BertConfig& config,
                                   DType dtype = DType::f32);
  // Strict loads of HF-named tensors (see above); on any error nothing changes.
  void load_hf_state_dict(const TensorList& tensors);
  void load_safetensors(const std::string& path);
  // The weights under HF's names (query/key/value split out of attn's in_proj), copies.
  TensorList hf_state_dict() const;

  // input_ids [B, L] (i32 / i64); attention_mask [B, L] (any dtype, nonzero = real token) and
  // token_type_ids [B, L] optional (undefined = all real / all 0; distilbert: all 0 or undefined).
  BertOutput forward(const Tensor& input_ids, const Tensor& attention_mask = {},
                     const Tensor& token_type_ids = {}, bool output_attentions = false);
  // The position ids forward uses for input_ids [B, L]: [B, L] i64 (see the family table above).
  Tensor position_ids(const Tensor& input_ids) const;

  // Fine-tuning. train() makes forward keep what backward needs and applies the config's dropout
  // where transformers does (eval(), the default, keeps nothing and drops nothing: inference).
  // Under nn::Autocast an f32 model computes in bf16 (attn/nn/module.h) with f32 weights and
  // gradients; a bf16 model runs inference only.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const;
  // The gradients of the last training forward's outputs, d last_hidden_state [B, L, H] and
  // d pooler_output [B, H] (either undefined = zero; any floating dtype): ADDS d(parameters) into
  // the gradients (named_parameters' grad tensors; zero_grad() clears them). Token ids have none.
  void backward(const Tensor& d_last_hidden_state, const Tensor& d_pooler_output = {});
  // Every parameter under attn's names (the net's state dict: q, k, v stacked as in_proj), its
  // value and gradient sharing the model's memory: for an optimizer (nn::AdamW).
  std::vector<nn::NamedParameter> named_parameters() const;
  void zero_grad();
  // Re-seeds every dropout: the same seed gives the same patterns on the next training forward.
  void manual_seed(uint64_t seed);

  const BertConfig& config() const { return config_; }
  bool has_pooler() const { return pooler_; }
  DType dtype() const { return dtype_; }

 private:
  struct Net;
  // The checkpoint's tensors checked against the config (attn::Error naming every missing, extra or
  // misshapen one) and renamed into the net's state dict (q, k, v stacked into in_proj).
  TensorList net_state(const TensorList& tensors) const;
  BertConfig config_;
  bool pooler_;
  DType dtype_ = DType::f32;
  std::unique_ptr<Net> net_;
};

}  // namespace attn::models
