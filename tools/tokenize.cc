// `attn tokenize`: the ids a BERT-family folder's tokenizer gives each text, one JSON list per
// line.
//
//   attn tokenize --model DIR --text "..." [--text ...] [--file lines.txt] [--max-length N]
//   [--tokens]
//
// The ids are transformers' tokenizer(text, truncation=True)["input_ids"] for that folder: special
// tokens added, truncated to the model's length (tokenizer_config.json's model_max_length) unless
// --max-length says otherwise (0: no truncation). --tokens prints the vocabulary strings instead.
// --file reads one text per line (UTF-8; a final "\r" of a line is dropped); --json reads a JSON
// list of strings, for texts that hold newlines or NUL. Texts are taken in the order --text,
// --file, --json.
#include <fmt/format.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/models/tokenizer.h"
#include "tools/command.h"

namespace attn::tools {
namespace {

struct TokenizeArgs {
  std::string model, file, json;
  std::vector<std::string> texts;
  int64_t max_length = -1;
  bool tokens = false;
};

std::vector<std::string> read_lines(const std::string& path, const char* cmd) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open --file {}", cmd, path));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::string> read_json_texts(const std::string& path, const char* cmd) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open --json {}", cmd, path));
  try {
    return nlohmann::json::parse(f).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        fmt::format("{}: --json {} is not a JSON list of strings ({})", cmd, path, e.what()));
  }
}

void run_tokenize(const TokenizeArgs& a) {
  if (a.max_length < -1) throw Error("attn tokenize: --max-length must be >= 0");
  const auto tok = models::WordPieceTokenizer::from_folder(a.model);
  std::vector<std::string> texts = a.texts;
  if (!a.file.empty()) {
    for (auto& l : read_lines(a.file, "attn tokenize")) texts.push_back(std::move(l));
  }
  if (!a.json.empty()) {
    for (auto& t : read_json_texts(a.json, "attn tokenize")) texts.push_back(std::move(t));
  }
  if (texts.empty()) throw Error("attn tokenize: give --text, --file or --json");
  std::string out;
  for (const std::string& t : texts) {  // every text is encoded before anything is printed
    const models::Encoding e = tok.encode(t, a.max_length);
    const nlohmann::json j = a.tokens ? nlohmann::json(e.tokens) : nlohmann::json(e.ids);
    out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  fmt::print("{}", out);
}

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Token ids of texts with a HuggingFace BERT-family tokenizer (one JSON list per text)");
  cmd->add_option("--model", args->model, "HuggingFace folder (tokenizer.json or vocab.txt)")
      ->required();
  cmd->add_option("--text", args->texts, "a text (repeatable)")->allow_extra_args(false);
  cmd->add_option("--file", args->file, "a file of texts, one per line");
  cmd->add_option("--json", args->json, "a file holding a JSON list of texts");
  cmd->add_option("--max-length", args->max_length,
                  "truncate to N tokens, special tokens included (default: the model's; 0: none)")
      ->check(at_least(0));
  cmd->add_flag("--tokens", args->tokens, "print the tokens instead of the ids");
  cmd->callback([args] { run_tokenize(*args); });
}

const Command reg{"tokenize", 70, &add_tokenize_command};

}  // namespace
}  // namespace attn::tools
