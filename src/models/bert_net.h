// BertModel's network (attn::nn modules under HF's names), shared by bert.cc (loading, inference)
// and bert_train.cc (fine-tuning).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "attn/models/bert.h"
#include "attn/nn/layers.h"
#include "attn/nn/transformer.h"

namespace attn::models {

struct BertModel::Net : nn::Module {
  Net(const BertConfig& c, bool pooler, DType dt);
  nn::Embedding word, position;
  std::unique_ptr<nn::Embedding> token_type;  // none in DistilBERT
  nn::LayerNorm norm;
  nn::Dropout embeddings_dropout;  // hidden_dropout_prob, after the embeddings' LayerNorm
  std::vector<std::unique_ptr<nn::TransformerEncoderLayer>> layers;
  std::unique_ptr<nn::Linear> dense;
  // What the last forward in training mode (gradients on) kept for backward: the output's shape and
  // the pooler's tanh output [B, H] (f32); none after an inference forward.
  Shape hidden_shape;
  Tensor pooled;
  bool cached = false;
};

}  // namespace attn::models
