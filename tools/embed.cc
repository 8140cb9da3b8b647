// `attn embed`: sentence embeddings of texts with a sentence-transformers folder, as an .npy [N,
// D].
//
//   attn embed --model DIR --text "..." [--text ...] [--file lines.txt] [--json texts.json]
//              --out E.npy [--batch-size 32]
//
// The embeddings are sentence-transformers' SentenceTransformer(DIR).encode(texts): that folder's
// tokenizer truncated to max_seq_length, its BertModel, its pooling (1_Pooling/config.json) and
// the Normalize module when modules.json lists it (attn::models::SentenceEncoder). --file reads one
// text per line, --json a JSON list of strings; a progress bar runs on stderr for long inputs.
// Everything is read and computed before E.npy is written (atomically), so a failure writes
// nothing.
//
// Hidden, for the tests that compare with transformers: --dump-hidden DIR runs all texts as one
// padded batch and writes DIR/{input_ids, attention_mask, last_hidden_state, pooler_output,
// attentions}.npy (attentions: [layers, B, heads, L, L]).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/io.h"
#include "attn/models/sentence.h"
#include "tools/command.h"
#include "tools/progress.h"

namespace attn::tools {
namespace {

constexpr const char* kCmd = "attn embed";

struct EmbedArgs {
  std::string model, file, json, out, dump_hidden;
  std::vector<std::string> texts;
  int64_t batch_size = 32;
};

[[noreturn]] void fail(const std::string& msg) {
  throw Error(fmt::format("{}: {}", kCmd, msg));
}

std::vector<std::string> gather_texts(const EmbedArgs& a) {
  std::vector<std::string> texts = a.texts;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) fail(fmt::format("cannot open --file {}", a.file));
    std::string line;
    while (std::getline(f, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      texts.push_back(std::move(line));
    }
  }
  if (!a.json.empty()) {
    std::ifstream f(a.json, std::ios::binary);
    if (!f) fail(fmt::format("cannot open --json {}", a.json));
    try {
      for (auto& t : nlohmann::json::parse(f).get<std::vector<std::string>>()) texts.push_back(t);
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("--json {} is not a JSON list of strings ({})", a.json, e.what()));
    }
  }
  if (texts.empty()) fail("give --text, --file or --json");
  return texts;
}

void dump_hidden(models::SentenceEncoder& enc, const std::vector<std::string>& texts,
                 const std::string& dir) {
  const models::TokenBatch b = enc.tokenize(texts);
  const models::BertOutput o =
      enc.model().forward(b.input_ids, b.attention_mask, b.token_type_ids, true);
  std::filesystem::create_directories(dir);
  const std::filesystem::path d(dir);
  write_npy((d / "input_ids.npy").string(), b.input_ids);
  write_npy((d / "attention_mask.npy").string(), b.attention_mask);
  write_npy((d / "last_hidden_state.npy").string(), o.last_hidden_state);
  if (o.pooler_output.defined()) write_npy((d / "pooler_output.npy").string(), o.pooler_output);
  if (!o.attentions.empty()) {
    Shape s = o.attentions[0].shape();
    s.insert(s.begin(), static_cast<int64_t>(o.attentions.size()));
    Tensor all = Tensor::empty(s, DType::f32);
    for (size_t l = 0; l < o.attentions.size(); ++l) {
      all.select(0, static_cast<int64_t>(l)).copy_from(o.attentions[l]);
    }
    write_npy((d / "attentions.npy").string(), all);
  }
}

void run_embed(const EmbedArgs& a) {
  if (a.out.empty() && a.dump_hidden.empty()) fail("--out is required");
  if (!a.out.empty() && std::filesystem::path(a.out).extension() != ".npy") {
    fail(fmt::format("--out {} must be a .npy file", a.out));
  }
  if (a.batch_size <= 0) fail(fmt::format("--batch-size must be > 0, got {}", a.batch_size));
  const std::vector<std::string> texts = gather_texts(a);
  models::SentenceEncoder enc = models::SentenceEncoder::from_folder(a.model);
  if (!a.dump_hidden.empty()) {
    dump_hidden(enc, texts, a.dump_hidden);
    if (a.out.empty()) return;
  }
  const auto n = static_cast<int64_t>(texts.size());
  std::unique_ptr<ProgressBar> bar;
  if (n > 2 * a.batch_size) bar = std::make_unique<ProgressBar>(n);
  const auto start = std::chrono::steady_clock::now();
  const Tensor e = enc.encode(texts, a.batch_size, [&](int64_t done, int64_t total) {
    if (!bar) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bar->update(done, 0.0, fmt::format("{}/{} texts  {:.1f} texts/s", done, total, done / s));
  });
  if (bar) bar->finish();
  write_npy(a.out, e);
  fmt::print(stderr, "wrote {} ({} x {})\n", a.out, e.size(0), e.size(1));
}

void add_embed_command(CLI::App& app) {
  auto args = std::make_shared<EmbedArgs>();
  CLI::App* cmd = app.add_subcommand(
      "embed", "Sentence embeddings (.npy) with a sentence-transformers / HuggingFace BERT folder");
  cmd->add_option("--model", args->model, "the model's folder (modules.json, config.json, ...)")
      ->required();
  cmd->add_option("--text", args->texts, "a text (repeatable)")->allow_extra_args(false);
  cmd->add_option("--file", args->file, "a file of texts, one per line");
  cmd->add_option("--json", args->json, "a file holding a JSON list of texts");
  cmd->add_option("--out", args->out, "output .npy, [texts, dimension] float32");
  cmd->add_option("--batch-size", args->batch_size, "texts per forward pass (default 32)");
  cmd->add_option("--dump-hidden", args->dump_hidden)->group("");  // tests only (see above)
  cmd->callback([args] { run_embed(*args); });
}

const Command reg{"embed", 71, &add_embed_command};

}  // namespace
}  // namespace attn::tools
