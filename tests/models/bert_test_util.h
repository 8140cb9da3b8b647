// A tiny BERT config for the models tests (bert_test.cc, bert_dropout_test.cc).
#pragma once
#include <cstdint>

#include "attn/models/bert.h"

namespace attn::models::testing {

// vocab 50, hidden 8, 2 heads, FFN 16, 16 positions, 2 token types, eps 1e-12, dropout as BertConfig's.
inline BertConfig tiny_config(int64_t layers = 2) {
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

}  // namespace attn::models::testing
