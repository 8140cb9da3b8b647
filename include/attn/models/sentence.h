// attn::models::SentenceEncoder: sentence embeddings as sentence-transformers computes them from a
// folder: modules.json (Transformer -> Pooling -> optional Normalize), sentence_bert_config.json's
// max_seq_length (capped at max_position_embeddings), 1_Pooling/config.json's modes.
//
//   tokens  = tokenizer(texts, padding=longest, truncation to max_seq_length)  [B, L]
//   hidden  = BertModel(tokens).last_hidden_state                              [B, L, H]
//   pooled  = concat of the modes, in sentence-transformers' order: cls, max, mean,
//             mean_sqrt_len (over the real tokens)                             [B, D]
//   output  = pooled / max(||pooled||, 1e-12) when Normalize is listed
//
// A module or mode attn does not run (Dense, weightedmean, lasttoken, do_lower_case) is refused
// with attn::Error naming the file.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/models/bert.h"
#include "attn/models/tokenizer.h"

namespace attn::models {

struct PoolingModes {
  bool cls = false, max = false, mean = true, mean_sqrt_len = false;
};

// A padded batch: ids padded with the tokenizer's [PAD], mask 1 = real token.
struct TokenBatch {
  Tensor input_ids, attention_mask, token_type_ids;  // [B, L] i64
};

class SentenceEncoder {
 public:
  static SentenceEncoder from_folder(const std::string& dir);

  // The batch the Transformer module builds for these texts.
  TokenBatch tokenize(const std::vector<std::string>& texts) const;
  // Pooling (+ normalisation) of one batch's hidden states [B, L, H] -> [B, D].
  Tensor pool(const Tensor& hidden, const Tensor& attention_mask) const;
  // [N, D] f32 embeddings in the order of `texts`. Texts are sorted by length and run in batches
  // of batch_size, as sentence-transformers' encode; progress(done, total) after each batch.
  Tensor encode(const std::vector<std::string>& texts, int64_t batch_size = 32,
                const std::function<void(int64_t, int64_t)>& progress = {});

  BertModel& model() { return model_; }
  const WordPieceTokenizer& tokenizer() const { return tokenizer_; }
  int64_t max_seq_length() const { return max_seq_length_; }
  int64_t dimension() const;
  const PoolingModes& pooling() const { return modes_; }
  bool normalize() const { return normalize_; }

 private:
  SentenceEncoder(BertModel model, WordPieceTokenizer tokenizer)
      : model_(std::move(model)), tokenizer_(std::move(tokenizer)) {}
  BertModel model_;
  WordPieceTokenizer tokenizer_;
  int64_t max_seq_length_ = 0;
  PoolingModes modes_;
  bool normalize_ = false;
};

}  // namespace attn::models
