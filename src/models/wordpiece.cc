// WordPiece tokenizer (BERT), reproducing HuggingFace tokenizers' BertNormalizer, BertPreTokenizer,
// WordPiece model and post-processors.
//
// Unicode data comes from ICU (libicu-dev), chosen over utf8proc on purpose: ICU answers every
// question this file asks from one library (general category, the White_Space property, full
// lowercase mappings with their one-to-many cases such as U+0130, NFD) and, unlike utf8proc, it
// also tells the Unicode version in which a character was assigned (u_charAge). HF classifies
// characters (control, punctuation, nonspacing mark) with tables frozen at Unicode 8.0, while ICU
// 72 knows Unicode 15; u_charAge lets us answer "was this a P* character in Unicode 8.0?" exactly
// instead of drifting on every character added since (U+2E43 is punctuation today and is not split
// by HF). CMake finds ICU with its own FindICU module.
#include <fmt/format.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "attn/error.h"
#include "attn/models/tokenizer.h"

namespace attn::models {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& msg) {
  throw Error("attn::models::WordPieceTokenizer: " + msg);
}

// ---- UTF-8 <-> code points ----

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = 0;
    char32_t c = 0;
    if (b < 0x80) {
      c = b, n = 1;
    } else if ((b & 0xE0) == 0xC0) {
      c = b & 0x1F, n = 2;
    } else if ((b & 0xF0) == 0xE0) {
      c = b & 0x0F, n = 3;
    } else if ((b & 0xF8) == 0xF0) {
      c = b & 0x07, n = 4;
    } else {
      fail(fmt::format("the text is not valid UTF-8 (byte {} of {})", i, s.size()));
    }
    if (i + n > s.size())
      fail(fmt::format("the text is not valid UTF-8 (truncated at byte {})", i));
    for (int k = 1; k < n; ++k) {
      const auto cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xC0) != 0x80) fail(fmt::format("the text is not valid UTF-8 (byte {})", i + k));
      c = (c << 6) | (cb & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 (Python and Rust refuse
    // them too, so HF never sees them).
    static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kMin[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
      fail(fmt::format("the text is not valid UTF-8 (byte {})", i));
    }
    out.push_back(c);
    i += static_cast<size_t>(n);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(const std::u32string& s, size_t begin = 0,
                        size_t end = std::u32string::npos) {
  std::string out;
  end = std::min(end, s.size());
  for (size_t i = begin; i < end; ++i) append_utf8(out, s[i]);
  return out;
}

// ---- character classes, as HF defines them ----

// HF's category tables are those of Unicode 8.0: a character assigned later belongs to none.
bool assigned_by_unicode_8(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return age[0] < 8 || (age[0] == 8 && age[1] == 0);
}

UCharCategory category_in_unicode_8(char32_t c) {
  const auto cat = static_cast<UCharCategory>(u_charType(static_cast<UChar32>(c)));
  return assigned_by_unicode_8(c) ? cat : U_UNASSIGNED;
}

// Rust's char::is_whitespace: the White_Space property (current Unicode).
bool is_whitespace_prop(char32_t c) {
  return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0;
}

// BertNormalizer's whitespace: \t \n \r and White_Space.
bool is_bert_whitespace(char32_t c) {
  return c == U'\t' || c == U'\n' || c == U'\r' || is_whitespace_prop(c);
}

// BertNormalizer's control: Cc, Cf, Co (the crate's "other" has no Cn and no Cs), minus \t \n \r.
bool is_bert_control(char32_t c) {
  if (c == U'\t' || c == U'\n' || c == U'\r') return false;
  const UCharCategory cat = category_in_unicode_8(c);
  return cat == U_CONTROL_CHAR || cat == U_FORMAT_CHAR || cat == U_PRIVATE_USE_CHAR;
}

// BertPreTokenizer's punctuation: ASCII punctuation (which includes symbols such as $ + < = > ^ `
// | ~) or any P* category.
bool is_bert_punctuation(char32_t c) {
  if ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
      (c >= 0x7B && c <= 0x7E)) {
    return true;
  }
  switch (category_in_unicode_8(c)) {
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

bool is_nonspacing_mark(char32_t c) {
  return category_in_unicode_8(c) == U_NON_SPACING_MARK;
}

// The CJK Unified Ideograph blocks BERT pads with spaces (not Hangul, Hiragana or Katakana).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::u16string to_utf16(const std::u32string& s) {
  std::u16string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x10000) {
      out.push_back(static_cast<char16_t>(c));
    } else {
      out.push_back(static_cast<char16_t>(0xD800 + ((c - 0x10000) >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + ((c - 0x10000) & 0x3FF)));
    }
  }
  return out;
}

void append_from_utf16(std::u32string& out, const UChar* s, int32_t n) {
  for (int32_t i = 0; i < n;) {
    UChar32 c;
    U16_NEXT(s, i, n, c);
    out.push_back(static_cast<char32_t>(c));
  }
}

std::u32string nfd(const std::u32string& s) {
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x80; })) return s;
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = unorm2_getNFDInstance(&err);
  const std::u16string src = to_utf16(s);
  // NFD of one UTF-16 unit is at most 4 units (Unicode's decomposition bound is 18 code points for
  // a whole segment; the retry below covers anything larger).
  std::u16string dst(src.size() * 4 + 16, u'\0');
  int32_t len = unorm2_normalize(
      n, reinterpret_cast<const UChar*>(src.data()), static_cast<int32_t>(src.size()),
      reinterpret_cast<UChar*>(dst.data()), static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.assign(static_cast<size_t>(len), u'\0');
    len = unorm2_normalize(n, reinterpret_cast<const UChar*>(src.data()),
                           static_cast<int32_t>(src.size()), reinterpret_cast<UChar*>(dst.data()),
                           len, &err);
  }
  if (U_FAILURE(err)) fail(fmt::format("Unicode NFD failed ({})", u_errorName(err)));
  std::u32string out;
  append_from_utf16(out, reinterpret_cast<const UChar*>(dst.data()), len);
  return out;
}

// Rust's char::to_lowercase, one character at a time (so U+03A3 is always U+03C3, never the
// final-sigma form, and U+0130 becomes "i" + U+0307, as in HF).
void append_lowercase(std::u32string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(c >= U'A' && c <= U'Z' ? c + 32 : c);
    return;
  }
  const std::u16string src = to_utf16(std::u32string(1, c));
  UChar dst[16];
  UErrorCode err = U_ZERO_ERROR;
  const int32_t len = u_strToLower(dst, 16, reinterpret_cast<const UChar*>(src.data()),
                                   static_cast<int32_t>(src.size()), "", &err);
  if (U_FAILURE(err)) fail(fmt::format("Unicode lowercasing failed ({})", u_errorName(err)));
  append_from_utf16(out, dst, len);
}

// ---- added tokens ----

// One piece of the text: an added token's id, or a stretch of text for the model.
struct Piece {
  int64_t id = -1;  // >= 0: an added token
  std::u32string text;
};

bool is_word_char(char32_t c) {
  return c == U'_' || u_isalnum(static_cast<UChar32>(c)) != 0;
}

// Splits `text` at the added tokens with `normalized == want_normalized`, leftmost-longest as HF's
// AddedVocabulary; lstrip / rstrip swallow the whitespace next to a match.
std::vector<Piece> split_added(const std::u32string& text, const std::vector<AddedToken>& tokens,
                               const std::vector<std::u32string>& contents, bool want_normalized) {
  std::vector<Piece> out;
  size_t start = 0;  // first character not yet emitted
  size_t i = 0;
  auto emit_text = [&](size_t end) {
    if (end > start) out.push_back({-1, text.substr(start, end - start)});
  };
  while (i < text.size()) {
    size_t best = tokens.size(), best_len = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::u32string& c = contents[t];
      if (tokens[t].normalized != want_normalized || c.empty() || c.size() <= best_len) continue;
      if (text.compare(i, c.size(), c) != 0) continue;
      if (tokens[t].single_word) {
        const bool left_ok = i == 0 || !is_word_char(text[i - 1]);
        const bool right_ok = i + c.size() == text.size() || !is_word_char(text[i + c.size()]);
        if (!left_ok || !right_ok) continue;
      }
      best = t, best_len = c.size();
    }
    if (best == tokens.size()) {
      ++i;
      continue;
    }
    size_t left = i, right = i + best_len;
    if (tokens[best].lstrip) {
      while (left > start && is_whitespace_prop(text[left - 1])) --left;
    }
    if (tokens[best].rstrip) {
      while (right < text.size() && is_whitespace_prop(text[right])) ++right;
    }
    emit_text(left);
    out.push_back({tokens[best].id, {}});
    start = i = right;
  }
  emit_text(text.size());
  return out;
}

// ---- loading ----

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(fmt::format("cannot open {}", path));
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    fail(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
}

template <class T>
T get_or(const json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

// A special token given in tokenizer_config.json as a string or as an AddedToken dict.
std::string special_name(const json& cfg, const char* key, const std::string& fallback) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return fallback;
}

// model_max_length and truncation_side from tokenizer_config.json (transformers' view of the
// model's length; its "no limit" sentinel is a huge number).
void apply_tokenizer_config(WordPieceConfig& c, const json& cfg) {
  const auto it = cfg.find("model_max_length");
  if (it != cfg.end() && it->is_number()) {
    const double v = it->get<double>();
    if (v > 0 && v < 1e15) c.model_max_length = static_cast<int64_t>(v);
  }
  c.truncate_left = get_or<std::string>(cfg, "truncation_side", "right") == "left";
}

}  // namespace

// ---- the tokenizer ----

WordPieceTokenizer::WordPieceTokenizer(WordPieceConfig config) : c_(std::move(config)) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : c_.vocab) {
    if (id < 0) fail(fmt::format("the vocabulary gives '{}' the negative id {}", tok, id));
    max_id = std::max(max_id, id);
  }
  for (const AddedToken& t : c_.added_tokens) max_id = std::max(max_id, t.id);
  if (max_id > 10'000'000) fail(fmt::format("ids up to {} are not a vocabulary", max_id));
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : c_.vocab) id_to_token_[static_cast<size_t>(id)] = tok;
  for (const AddedToken& t : c_.added_tokens) {
    if (t.id < 0) fail(fmt::format("the added token '{}' has the negative id {}", t.content, t.id));
    id_to_token_[static_cast<size_t>(t.id)] = t.content;
    added_u32_.push_back(decode_utf8(t.content));
  }
  const auto unk = c_.vocab.find(c_.unk_token);
  if (unk == c_.vocab.end())
    fail(fmt::format("the unknown token '{}' is not in the vocabulary", c_.unk_token));
  unk_id_ = unk->second;
  if (c_.max_input_chars_per_word < 0) fail("max_input_chars_per_word must be >= 0");
}

int64_t WordPieceTokenizer::token_to_id(const std::string& token) const {
  for (const AddedToken& t : c_.added_tokens) {
    if (t.content == token) return t.id;
  }
  const auto it = c_.vocab.find(token);
  return it == c_.vocab.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size()) fail(fmt::format("id {} is outside the vocabulary", id));
  return id_to_token_[static_cast<size_t>(id)];
}

int64_t WordPieceTokenizer::pad_id() const {
  const int64_t id = token_to_id(c_.pad_token);
  return id < 0 ? 0 : id;
}

namespace {

std::u32string normalize_u32(const WordPieceConfig& c, const std::u32string& in) {
  std::u32string s;
  s.reserve(in.size());
  for (char32_t ch : in) {
    if (c.clean_text) {
      if (ch == 0 || ch == 0xFFFD || is_bert_control(ch)) continue;
      if (is_bert_whitespace(ch)) ch = U' ';
    }
    if (c.handle_chinese_chars && is_chinese_char(ch)) {
      s.push_back(U' ');
      s.push_back(ch);
      s.push_back(U' ');
    } else {
      s.push_back(ch);
    }
  }
  const bool strip = c.strip_accents < 0 ? c.lowercase : c.strip_accents != 0;
  if (strip) {
    std::u32string d = nfd(s);
    s.clear();
    for (char32_t ch : d) {
      if (!is_nonspacing_mark(ch)) s.push_back(ch);
    }
  }
  if (c.lowercase) {
    std::u32string l;
    l.reserve(s.size());
    for (char32_t ch : s) append_lowercase(l, ch);
    s = std::move(l);
  }
  return s;
}

std::vector<std::u32string> pre_tokenize_u32(const std::u32string& s) {
  std::vector<std::u32string> words;
  std::u32string cur;
  for (char32_t ch : s) {
    if (is_whitespace_prop(ch)) {
      if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
    } else if (is_bert_punctuation(ch)) {
      if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
      words.emplace_back(1, ch);
    } else {
      cur.push_back(ch);
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

}  // namespace

std::string WordPieceTokenizer::normalize(std::string_view text) const {
  return encode_utf8(normalize_u32(c_, decode_utf8(text)));
}

std::vector<std::string> WordPieceTokenizer::pre_tokenize(std::string_view normalized) const {
  std::vector<std::string> out;
  for (const auto& w : pre_tokenize_u32(decode_utf8(normalized))) out.push_back(encode_utf8(w));
  return out;
}

// Greedy longest-match-first over the word's characters; a word with a piece that matches nothing,
// or with more than max_input_chars_per_word characters, is one [UNK].
void WordPieceTokenizer::wordpiece(const std::u32string& word, std::vector<int64_t>& out) const {
  if (static_cast<int64_t>(word.size()) > c_.max_input_chars_per_word) {
    out.push_back(unk_id_);
    return;
  }
  const size_t first = out.size();
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int64_t found = -1;
    while (start < end) {
      std::string piece = start > 0 ? c_.continuing_subword_prefix : std::string();
      piece += encode_utf8(word, start, end);
      const auto it = c_.vocab.find(piece);
      if (it != c_.vocab.end()) {
        found = it->second;
        break;
      }
      --end;
    }
    if (found < 0) {
      out.resize(first);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

void WordPieceTokenizer::encode_segment(const std::u32string& raw,
                                        std::vector<int64_t>& out) const {
  const std::u32string norm = normalize_u32(c_, raw);
  for (const Piece& p : split_added(norm, c_.added_tokens, added_u32_, /*want_normalized=*/true)) {
    if (p.id >= 0) {
      out.push_back(p.id);
      continue;
    }
    for (const auto& w : pre_tokenize_u32(p.text)) wordpiece(w, out);
  }
}

Encoding WordPieceTokenizer::encode(std::string_view text, int64_t max_length,
                                    bool add_special_tokens) const {
  const std::u32string raw = decode_utf8(text);
  // Added tokens with normalized = false are matched in the raw text; the others (rare in BERT
  // folders) in the normalized text of each stretch between raw matches.
  std::vector<int64_t> seq;
  for (const Piece& p : split_added(raw, c_.added_tokens, added_u32_, /*want_normalized=*/false)) {
    if (p.id >= 0) {
      seq.push_back(p.id);
    } else {
      encode_segment(p.text, seq);
    }
  }

  if (max_length < 0) max_length = c_.model_max_length;
  const int64_t n_special =
      add_special_tokens ? static_cast<int64_t>(c_.prefix.size() + c_.suffix.size()) : 0;
  if (max_length > 0) {
    if (max_length < n_special) {
      fail(fmt::format("max_length {} leaves no room for the {} special tokens", max_length,
                       n_special));
    }
    const auto keep = static_cast<size_t>(max_length - n_special);
    if (seq.size() > keep) {
      if (c_.truncate_left) {
        seq.erase(seq.begin(), seq.end() - static_cast<std::ptrdiff_t>(keep));
      } else {
        seq.resize(keep);
      }
    }
  }

  Encoding e;
  auto push = [&](int64_t id, int64_t type) {
    e.ids.push_back(id);
    e.type_ids.push_back(type);
    e.tokens.push_back(id_to_token(id));
  };
  if (add_special_tokens) {
    for (const SpecialPiece& p : c_.prefix) push(p.id, p.type_id);
  }
  for (int64_t id : seq) push(id, c_.sequence_type_id);
  if (add_special_tokens) {
    for (const SpecialPiece& p : c_.suffix) push(p.id, p.type_id);
  }
  return e;
}

// ---- constructors from files ----

WordPieceTokenizer WordPieceTokenizer::from_tokenizer_json(const std::string& path) {
  const json j = read_json(path);
  WordPieceConfig c;
  try {
    const json& model = j.at("model");
    const std::string type = get_or<std::string>(model, "type", "");
    if (type != "WordPiece") {
      fail(fmt::format("{}: model.type is '{}'; only WordPiece is supported", path, type));
    }
    for (const auto& [tok, id] : model.at("vocab").items()) c.vocab.emplace(tok, id.get<int64_t>());
    c.unk_token = get_or<std::string>(model, "unk_token", "[UNK]");
    c.continuing_subword_prefix = get_or<std::string>(model, "continuing_subword_prefix", "##");
    c.max_input_chars_per_word = get_or<int64_t>(model, "max_input_chars_per_word", 100);

    const json norm = j.value("normalizer", json());
    if (norm.is_null()) {
      c.clean_text = c.handle_chinese_chars = c.lowercase = false;
      c.strip_accents = 0;
    } else {
      const std::string ntype = get_or<std::string>(norm, "type", "");
      if (ntype != "BertNormalizer") {
        fail(fmt::format("{}: normalizer.type is '{}'; only BertNormalizer is supported", path,
                         ntype));
      }
      c.clean_text = get_or<bool>(norm, "clean_text", true);
      c.handle_chinese_chars = get_or<bool>(norm, "handle_chinese_chars", true);
      c.lowercase = get_or<bool>(norm, "lowercase", true);
      const auto sa = norm.find("strip_accents");
      c.strip_accents = (sa == norm.end() || sa->is_null()) ? -1 : (sa->get<bool>() ? 1 : 0);
    }

    const json pre = j.value("pre_tokenizer", json());
    const std::string ptype = pre.is_null() ? "null" : get_or<std::string>(pre, "type", "");
    if (ptype != "BertPreTokenizer") {
      fail(fmt::format("{}: pre_tokenizer.type is '{}'; only BertPreTokenizer is supported", path,
                       ptype));
    }

    for (const json& t : j.value("added_tokens", json::array())) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.id = t.at("id").get<int64_t>();
      a.special = get_or<bool>(t, "special", false);
      a.lstrip = get_or<bool>(t, "lstrip", false);
      a.rstrip = get_or<bool>(t, "rstrip", false);
      a.single_word = get_or<bool>(t, "single_word", false);
      a.normalized = get_or<bool>(t, "normalized", !a.special);
      c.added_tokens.push_back(std::move(a));
    }

    const json post = j.value("post_processor", json());
    if (!post.is_null()) {
      const std::string type_name = get_or<std::string>(post, "type", "");
      if (type_name == "BertProcessing") {
        const json& cls = post.at("cls");
        const json& sep = post.at("sep");
        c.prefix = {{cls.at(0).get<std::string>(), cls.at(1).get<int64_t>(), 0}};
        c.suffix = {{sep.at(0).get<std::string>(), sep.at(1).get<int64_t>(), 0}};
      } else if (type_name == "TemplateProcessing") {
        const json& specials = post.at("special_tokens");
        bool seen_sequence = false;
        for (const json& item : post.at("single")) {
          if (item.contains("Sequence")) {
            if (item["Sequence"].at("id").get<std::string>() != "A") {
              fail(fmt::format("{}: post_processor.single names a sequence other than $A", path));
            }
            seen_sequence = true;
            c.sequence_type_id = get_or<int64_t>(item["Sequence"], "type_id", 0);
            continue;
          }
          const json& st = item.at("SpecialToken");
          const std::string name = st.at("id").get<std::string>();
          const json& spec = specials.at(name);
          const json& ids = spec.at("ids");
          const json& toks = spec.at("tokens");
          for (size_t k = 0; k < ids.size(); ++k) {
            SpecialPiece p{toks.at(k).get<std::string>(), ids.at(k).get<int64_t>(),
                           get_or<int64_t>(st, "type_id", 0)};
            (seen_sequence ? c.suffix : c.prefix).push_back(std::move(p));
          }
        }
        if (!seen_sequence) fail(fmt::format("{}: post_processor.single has no $A", path));
      } else {
        fail(
            fmt::format("{}: post_processor.type is '{}'; only TemplateProcessing and "
                        "BertProcessing are supported",
                        path, type_name));
      }
    }

    const json trunc = j.value("truncation", json());
    if (!trunc.is_null()) {
      c.model_max_length = get_or<int64_t>(trunc, "max_length", 0);
      c.truncate_left = get_or<std::string>(trunc, "direction", "Right") == "Left";
    }
    const json pad = j.value("padding", json());
    if (!pad.is_null()) c.pad_token = get_or<std::string>(pad, "pad_token", "[PAD]");
  } catch (const json::exception& e) {
    fail(fmt::format("{}: unexpected layout: {}", path, e.what()));
  }
  // transformers' view of the model's length and the side it truncates wins over tokenizer.json's
  // own truncation settings (which transformers replaces on every call).
  const fs::path cfg = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    const json jc = read_json(cfg.string());
    apply_tokenizer_config(c, jc);
    c.pad_token = special_name(jc, "pad_token", c.pad_token);
  }
  return WordPieceTokenizer(std::move(c));
}

WordPieceTokenizer WordPieceTokenizer::from_vocab_txt(const std::string& vocab_path,
                                                      const std::string& tokenizer_config_path) {
  std::ifstream f(vocab_path, std::ios::binary);
  if (!f) fail(fmt::format("cannot open {}", vocab_path));
  WordPieceConfig c;
  std::string line;
  int64_t id = 0;
  while (std::getline(f, line)) {
    c.vocab.emplace(line, id++);  // one token per line, its id the line number
  }
  json cfg = json::object();
  if (!tokenizer_config_path.empty()) cfg = read_json(tokenizer_config_path);
  try {
    c.lowercase = get_or<bool>(cfg, "do_lower_case", true);
    const auto sa = cfg.find("strip_accents");
    c.strip_accents = (sa == cfg.end() || sa->is_null()) ? -1 : (sa->get<bool>() ? 1 : 0);
    c.handle_chinese_chars = get_or<bool>(cfg, "tokenize_chinese_chars", true);
    if (!get_or<bool>(cfg, "do_basic_tokenize", true)) {
      fail(fmt::format("{}: do_basic_tokenize false is not supported", tokenizer_config_path));
    }
    apply_tokenizer_config(c, cfg);
    c.unk_token = special_name(cfg, "unk_token", "[UNK]");
    c.pad_token = special_name(cfg, "pad_token", "[PAD]");
    const std::string cls = special_name(cfg, "cls_token", "[CLS]");
    const std::string sep = special_name(cfg, "sep_token", "[SEP]");
    const std::string mask = special_name(cfg, "mask_token", "[MASK]");
    // transformers registers the special tokens as added tokens matched in the raw text.
    for (const std::string& s : {c.pad_token, c.unk_token, cls, sep, mask}) {
      const auto it = c.vocab.find(s);
      if (it == c.vocab.end()) continue;
      AddedToken a;
      a.content = s, a.id = it->second, a.special = true;
      c.added_tokens.push_back(std::move(a));
    }
    for (const std::string& s : {cls, sep}) {
      if (c.vocab.find(s) == c.vocab.end()) {
        fail(fmt::format("{}: the special token '{}' is not in the vocabulary", vocab_path, s));
      }
    }
    c.prefix = {{cls, c.vocab.at(cls), 0}};
    c.suffix = {{sep, c.vocab.at(sep), 0}};
  } catch (const json::exception& e) {
    fail(fmt::format("{}: unexpected layout: {}", tokenizer_config_path, e.what()));
  }
  return WordPieceTokenizer(std::move(c));
}

WordPieceTokenizer WordPieceTokenizer::from_folder(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(fmt::format("{} is not a folder", dir));
  if (fs::exists(d / "tokenizer.json")) return from_tokenizer_json((d / "tokenizer.json").string());
  if (fs::exists(d / "vocab.txt")) {
    const fs::path cfg = d / "tokenizer_config.json";
    return from_vocab_txt((d / "vocab.txt").string(), fs::exists(cfg) ? cfg.string() : "");
  }
  fail(fmt::format("{} has neither tokenizer.json nor vocab.txt", dir));
}

}  // namespace attn::models
