// WordPieceTokenizer on hand-written hard cases whose answers were taken from HuggingFace
// tokenizers' Rust rules (and checked against tokenizers 0.23): the Unicode 8.0 category tables,
// per-character lowercasing, accent stripping before lowercasing, added tokens in the raw text,
// truncation. python/tests/test_models_tokenizer.py compares with HF itself on the real vocabulary.
#include "attn/models/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/io_test_util.h"

namespace attn::models {
namespace {

using testing_io::expect_error;
using testing_io::ScratchDir;
using testing_io::write_bytes;

WordPieceConfig small_config() {
  WordPieceConfig c;
  const std::vector<std::string> vocab = {"[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]", "un",
                                          "##aff", "##able", "aff",   "hello", "world",  ",",
                                          "!",     "a",      "b",     "##b",   "[",      "]",
                                          "mask",  "中",     "$",     "5",     "cafe",   "i"};
  for (size_t i = 0; i < vocab.size(); ++i) c.vocab[vocab[i]] = static_cast<int64_t>(i);
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    AddedToken a;
    a.content = s, a.id = c.vocab.at(s), a.special = true;
    c.added_tokens.push_back(a);
  }
  c.prefix = {{"[CLS]", 2, 0}};
  c.suffix = {{"[SEP]", 3, 0}};
  c.max_input_chars_per_word = 12;
  return c;
}

std::vector<std::string> tokens(const WordPieceTokenizer& t, const std::string& text,
                                int64_t max_length = -1) {
  return t.encode(text, max_length).tokens;
}

TEST(WordPieceNormalizer, StripsAccentsBeforeLowercasing) {
  const WordPieceTokenizer t(small_config());
  EXPECT_EQ(t.normalize("Héllo CAFÉ naïve"), "hello cafe naive");
  // U+0130 decomposes to I + U+0307; the mark is stripped before lowercasing, so "i" remains.
  EXPECT_EQ(t.normalize("\xC4\xB0"), "i");
  // Combining marks on their own are Mn and go too.
  EXPECT_EQ(t.normalize("a\xCC\x80\xCC\x81"
                        "b"),
            "ab");
}

TEST(WordPieceNormalizer, LowercasesOneCharacterAtATime) {
  WordPieceConfig c = small_config();
  c.strip_accents = 0;
  const WordPieceTokenizer t(c);
  // Full mapping of U+0130 without accent stripping: "i" + U+0307 (Rust's char::to_lowercase).
  EXPECT_EQ(t.normalize("\xC4\xB0"), "i\xCC\x87");
  // Capital sigma is always small sigma, never the final form (no word context).
  EXPECT_EQ(t.normalize("\xCE\xA3\xCE\x91\xCE\xA3"), "\xCF\x83\xCE\xB1\xCF\x83");
  EXPECT_EQ(t.normalize("Caf\xC3\xA9"), "caf\xC3\xA9");
}

TEST(WordPieceNormalizer, CleansControlsAndWhitespaceAsBert) {
  const WordPieceTokenizer t(small_config());
  // NUL, U+FFFD, Cc (\x01, \x7f), Cf (U+200B, U+FEFF) and private use (U+E000) are removed.
  EXPECT_EQ(t.normalize(std::string("a\0b", 3) + "\x01"
                                                 "c\x7f"
                                                 "d\xE2\x80\x8B"
                                                 "e\xEF\xBB\xBF"
                                                 "f"
                                                 "\xEF\xBF\xBDg\xEE\x80\x80h"),
            "abcdefgh");
  // \t \n \r and White_Space become ' '; \x0b and \x0c are Cc and removed before that.
  EXPECT_EQ(t.normalize("a\tb\nc\rd\xE3\x80\x80"
                        "e\x0b"
                        "f\x0cg"),
            "a b c d efg");
  // U+08E2 became Cf in Unicode 9.0: HF's tables (8.0) do not know it, so it stays.
  EXPECT_EQ(t.normalize("a\xE0\xA3\xA2"
                        "b"),
            "a\xE0\xA3\xA2"
            "b");
}

TEST(WordPieceNormalizer, PadsCjkIdeographsOnly) {
  const WordPieceTokenizer t(small_config());
  EXPECT_EQ(t.normalize("x\xE4\xB8\xAD"
                        "y"),
            "x \xE4\xB8\xAD y");
  // Hiragana and Hangul are not padded; NFD (accent stripping) splits a Hangul syllable into jamo.
  EXPECT_EQ(t.normalize("\xE3\x81\x82\xED\x95\x9C"),
            "\xE3\x81\x82\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");
}

TEST(WordPiecePreTokenizer, IsolatesAsciiAndUnicode8Punctuation) {
  const WordPieceTokenizer t(small_config());
  EXPECT_EQ(t.pre_tokenize("hello,world! $5  x"),
            (std::vector<std::string>{"hello", ",", "world", "!", "$", "5", "x"}));
  // U+2E42 (Ps, Unicode 8.0) is split off; U+2E43 (Po, Unicode 9.0) is not.
  EXPECT_EQ(t.pre_tokenize("a\xE2\xB9\x82"
                           "b"),
            (std::vector<std::string>{"a", "\xE2\xB9\x82", "b"}));
  EXPECT_EQ(t.pre_tokenize("a\xE2\xB9\x83"
                           "b"),
            (std::vector<std::string>{"a\xE2\xB9\x83"
                                      "b"}));
  EXPECT_TRUE(t.pre_tokenize("   ").empty());
}

TEST(WordPieceModel, GreedyLongestMatchAndUnknownWords) {
  const WordPieceTokenizer t(small_config());
  EXPECT_EQ(tokens(t, "unaffable"),
            (std::vector<std::string>{"[CLS]", "un", "##aff", "##able", "[SEP]"}));
  // One piece that matches nothing makes the whole word one [UNK].
  EXPECT_EQ(tokens(t, "unaffablex hello"),
            (std::vector<std::string>{"[CLS]", "[UNK]", "hello", "[SEP]"}));
  // 13 characters > max_input_chars_per_word (12), even though "b" + "##b"... would match.
  EXPECT_EQ(tokens(t, "bbbbbbbbbbbbb"), (std::vector<std::string>{"[CLS]", "[UNK]", "[SEP]"}));
  EXPECT_EQ(tokens(t, "bbbbbbbbbbbb").size(), 14u);
  EXPECT_EQ(tokens(t, ""), (std::vector<std::string>{"[CLS]", "[SEP]"}));
}

TEST(WordPieceAddedTokens, MatchedInTheRawTextBeforeNormalizing) {
  const WordPieceTokenizer t(small_config());
  EXPECT_EQ(tokens(t, "a[MASK]b"),
            (std::vector<std::string>{"[CLS]", "a", "[MASK]", "b", "[SEP]"}));
  // Lowercase "[mask]" is not the token: it is normalized and split as punctuation.
  EXPECT_EQ(tokens(t, "[mask]"), (std::vector<std::string>{"[CLS]", "[", "mask", "]", "[SEP]"}));
  // "[MASK]" written in capitals would be lowercased if it went through the normalizer.
  EXPECT_EQ(t.encode("[MASK][MASK]").ids, (std::vector<int64_t>{2, 4, 4, 3}));
}

TEST(WordPieceAddedTokens, LstripAndRstripSwallowWhitespace) {
  WordPieceConfig c = small_config();
  c.added_tokens[4].lstrip = true;  // [MASK]
  const WordPieceTokenizer t(c);
  EXPECT_EQ(tokens(t, "a   [MASK] b"),
            (std::vector<std::string>{"[CLS]", "a", "[MASK]", "b", "[SEP]"}));
}

TEST(WordPieceTruncation, KeepsRoomForSpecialTokens) {
  WordPieceConfig c = small_config();
  c.model_max_length = 4;
  const WordPieceTokenizer t(c);
  EXPECT_EQ(tokens(t, "hello world a b"),
            (std::vector<std::string>{"[CLS]", "hello", "world", "[SEP]"}));
  EXPECT_EQ(tokens(t, "hello world a b", 0).size(), 6u);  // 0: no truncation
  EXPECT_EQ(tokens(t, "hello world a b", 3), (std::vector<std::string>{"[CLS]", "hello", "[SEP]"}));
  expect_error([&] { t.encode("hello", 1); }, {"max_length 1", "special tokens"});
  c.truncate_left = true;
  const WordPieceTokenizer left(c);
  EXPECT_EQ(tokens(left, "hello world a b"),
            (std::vector<std::string>{"[CLS]", "a", "b", "[SEP]"}));
}

TEST(WordPieceInput, RefusesInvalidUtf8) {
  const WordPieceTokenizer t(small_config());
  expect_error([&] { t.encode("a\xC3"); }, {"not valid UTF-8"});
  expect_error([&] { t.encode("\xC0\xAF"); }, {"not valid UTF-8"});      // overlong "/"
  expect_error([&] { t.encode("\xED\xA0\x80"); }, {"not valid UTF-8"});  // a surrogate
}

TEST(WordPieceFiles, TokenizerJsonAndVocabTxtAgree) {
  ScratchDir dir;
  write_bytes(dir.file("vocab.txt"), "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\n,\n");
  write_bytes(dir.file("tokenizer_config.json"),
              R"({"do_lower_case": true, "model_max_length": 5, "unk_token": "[UNK]"})");
  const auto from_vocab = WordPieceTokenizer::from_folder(dir.path().string());
  EXPECT_EQ(from_vocab.encode("Hellos, HELLO").ids, (std::vector<int64_t>{2, 5, 6, 7, 3}));
  write_bytes(dir.file("tokenizer.json"), R"({
    "added_tokens": [{"id": 4, "content": "[MASK]", "special": true, "normalized": false}],
    "normalizer": {"type": "BertNormalizer", "lowercase": true, "strip_accents": null},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 2], "sep": ["[SEP]", 3]},
    "truncation": null,
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "hello": 5,
                        "##s": 6, ",": 7}}})");
  const auto from_json = WordPieceTokenizer::from_folder(dir.path().string());
  EXPECT_EQ(from_json.config().model_max_length, 5);  // from tokenizer_config.json
  EXPECT_EQ(from_json.encode("Hellos, HELLO [MASK]", 0).ids,
            (std::vector<int64_t>{2, 5, 6, 7, 5, 4, 3}));
}

TEST(WordPieceFiles, RefusesWhatItCannotReproduce) {
  ScratchDir dir;
  const std::string base = R"("pre_tokenizer": {"type": "BertPreTokenizer"},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}})";
  write_bytes(dir.file("tokenizer.json"), "{\"normalizer\": {\"type\": \"NFKC\"}, " + base + "}");
  expect_error([&] { WordPieceTokenizer::from_folder(dir.path().string()); },
               {"tokenizer.json", "normalizer.type is 'NFKC'"});
  write_bytes(dir.file("tokenizer.json"), R"({"model": {"type": "BPE", "vocab": {}}})");
  expect_error([&] { WordPieceTokenizer::from_folder(dir.path().string()); },
               {"model.type is 'BPE'"});
  write_bytes(dir.file("tokenizer.json"), "{not json");
  expect_error([&] { WordPieceTokenizer::from_folder(dir.path().string()); },
               {"tokenizer.json", "not valid JSON"});
  expect_error([&] { WordPieceTokenizer::from_folder(dir.file("absent")); }, {"not a folder"});
}

}  // namespace
}  // namespace attn::models
