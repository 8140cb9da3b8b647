// attn::models::WordPieceTokenizer: BERT's tokenizer, giving exactly the ids of HuggingFace's
// `tokenizers` (the Rust library behind transformers' fast tokenizers) for a BERT-family folder.
//
// Pipeline (HF's names): added tokens ([CLS], [MASK], ... matched in the raw text first) ->
// BertNormalizer (clean_text, handle_chinese_chars, strip_accents, lowercase) -> BertPreTokenizer
// (split on whitespace, isolate punctuation) -> WordPiece (greedy longest match, "##"
// continuations, [UNK] for a word with no split or longer than max_input_chars_per_word) ->
// truncation -> post-processor ([CLS] $A [SEP], TemplateProcessing or BertProcessing).
//
// Unicode: HF classifies characters with the tables of Unicode 8.0 (its unicode_categories crate)
// but lowercases and tests whitespace with the current ones; this class does the same with ICU
// (see wordpiece.cc for why ICU).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attn::models {

struct Encoding {
  std::vector<int64_t> ids;         // with the special tokens
  std::vector<int64_t> type_ids;    // token_type_ids (segment 0 for a single text)
  std::vector<std::string> tokens;  // the vocabulary strings of ids
};

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false;  // the match swallows whitespace on that side
  bool single_word = false;             // only where it is not inside a word
  bool normalized = false;              // matched in the normalized text instead of the raw one
};

struct SpecialPiece {
  std::string token;
  int64_t id = 0;
  int64_t type_id = 0;
};

struct WordPieceConfig {
  // BertNormalizer
  bool clean_text = true;
  bool handle_chinese_chars = true;
  int strip_accents = -1;  // -1: HF's null (follow lowercase), 0: no, 1: yes
  bool lowercase = true;
  // WordPiece model
  std::unordered_map<std::string, int64_t> vocab;
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";
  int64_t max_input_chars_per_word = 100;
  std::vector<AddedToken> added_tokens;
  // Post-processor for one text: the special tokens before and after the sequence.
  std::vector<SpecialPiece> prefix, suffix;
  int64_t sequence_type_id = 0;
  // Truncation: tokens of the result, special tokens included; 0 = none. truncate_left drops the
  // first tokens of the sequence instead of the last (tokenizer_config's truncation_side "left").
  int64_t model_max_length = 0;
  bool truncate_left = false;
  std::string pad_token = "[PAD]";
};

class WordPieceTokenizer {
 public:
  explicit WordPieceTokenizer(WordPieceConfig config);
  // A HuggingFace folder: tokenizer.json (+ tokenizer_config.json for model_max_length and
  // truncation_side), or else vocab.txt + tokenizer_config.json. Throws attn::Error naming the file
  // and the field for anything it cannot reproduce exactly (another normalizer, pre-tokenizer or
  // model type).
  static WordPieceTokenizer from_folder(const std::string& dir);
  static WordPieceTokenizer from_tokenizer_json(const std::string& path);
  static WordPieceTokenizer from_vocab_txt(const std::string& vocab_path,
                                           const std::string& tokenizer_config_path = "");

  // `text` is UTF-8 (invalid UTF-8 is refused). max_length: tokens of the result, special ones
  // included; -1 = the model's (config().model_max_length), 0 = no truncation. As transformers'
  // tokenizer(text, truncation=True, max_length=...)["input_ids"].
  Encoding encode(std::string_view text, int64_t max_length = -1,
                  bool add_special_tokens = true) const;
  // The stages, for tests: BertNormalizer's output, and BertPreTokenizer's words (UTF-8).
  std::string normalize(std::string_view text) const;
  std::vector<std::string> pre_tokenize(std::string_view normalized) const;

  int64_t token_to_id(const std::string& token) const;  // -1 when absent
  const std::string& id_to_token(int64_t id) const;
  int64_t pad_id() const;
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  const WordPieceConfig& config() const { return c_; }

 private:
  void wordpiece(const std::u32string& word, std::vector<int64_t>& out) const;
  void encode_segment(const std::u32string& raw, std::vector<int64_t>& out) const;
  WordPieceConfig c_;
  int64_t unk_id_;
  std::vector<std::string> id_to_token_;
  std::vector<std::u32string> added_u32_;  // the added tokens' contents as code points
};

}  // namespace attn::models
