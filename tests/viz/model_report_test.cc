// attn::viz::write_model_report on a tiny random BERT (2 layers x 2 heads) and a vocab.txt
// tokenizer: the files it writes, the tokens and entropies it returns, and its refusals. The real
// model (all-MiniLM-L6-v2) is tested through the CLI (python/tests/test_models_viz.py) and Python
// (python/tests/test_models_report.py).
#include "attn/viz/model_report.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/nn.h"
#include "attn/viz.h"
#include "core/io_test_util.h"

namespace attn::viz {
namespace {

namespace fs = std::filesystem;
using testing_io::expect_error;
using testing_io::ScratchDir;
using testing_io::write_bytes;

models::BertConfig tiny_config() {
  models::BertConfig c;
  c.vocab_size = 8;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 16;
  c.max_position_embeddings = 16;
  return c;
}

models::WordPieceTokenizer tiny_tokenizer(const ScratchDir& dir) {
  write_bytes(dir.file("vocab.txt"), "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\n,\n");
  write_bytes(dir.file("tokenizer_config.json"), R"({"do_lower_case": true})");
  return models::WordPieceTokenizer::from_folder(dir.path().string());
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> tree(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    out.push_back(fs::relative(e.path(), root).string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ModelReport, OneTextWritesTheReportAndEveryHeadAsPngAndSvg) {
  nn::manual_seed(3);
  models::BertModel model(tiny_config());
  ScratchDir dir;
  const auto tok = tiny_tokenizer(dir);
  const fs::path out = dir.path() / "out";
  ModelReportOptions o;
  o.model_path = "my/tiny-bert";
  const ModelReport r = write_model_report(model, tok, {"Hellos, hello"}, out.string(), o);

  EXPECT_EQ(tree(out),
            (std::vector<std::string>{"layer0-head0.png", "layer0-head0.svg", "layer0-head1.png",
                                      "layer0-head1.svg", "layer1-head0.png", "layer1-head0.svg",
                                      "layer1-head1.png", "layer1-head1.svg", "report.html"}));
  EXPECT_EQ(r.files.size(), 9u);
  EXPECT_EQ(r.html, (out / "report.html").string());
  EXPECT_EQ(r.reports, std::vector<std::string>{r.html});
  EXPECT_EQ(r.layers, 2);
  EXPECT_EQ(r.heads, 2);
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0],
            (std::vector<std::string>{"[CLS]", "hello", "##s", ",", "hello", "[SEP]"}));

  // The entropies are those of the model's own attentions on these ids, and the page shows them.
  const Tensor ids = Tensor::from_vector({1, 6}, {2, 5, 6, 7, 5, 3}, DType::i64);
  const models::BertOutput ref = model.forward(ids, {}, {}, true);
  const std::string page = read(out / "report.html");
  EXPECT_NE(page.find("attn viz: tiny-bert"), std::string::npos);  // the folder's name
  EXPECT_NE(page.find("my/tiny-bert"), std::string::npos);
  ASSERT_EQ(r.entropy[0].size(), 2u);
  for (int64_t l = 0; l < 2; ++l) {
    const std::vector<double> want = mean_row_entropy(ref.attentions[l].select(0, 0));
    for (int64_t h = 0; h < 2; ++h) {
      const double got = r.entropy[0][l][h];
      EXPECT_NEAR(got, want[h], 1e-12) << l << " " << h;
      EXPECT_GT(got, 0);
      EXPECT_LE(got, std::log(6.0) + 1e-12);
      const std::regex fig(fmt::format(
          "<figure id=\"l{0}-h{1}\" data-layer=\"{0}\" data-head=\"{1}\" data-entropy=\"{2:.7f}\">",
          l, h, got));
      EXPECT_TRUE(std::regex_search(page, fig)) << l << " " << h;
    }
    const std::string png = read(out / fmt::format("layer{}-head0.png", l));
    EXPECT_EQ(png.substr(0, 4), "\x89PNG");
    EXPECT_NE(read(out / fmt::format("layer{}-head1.svg", l)).find("</svg>"), std::string::npos);
  }
}

TEST(ModelReport, SeveralTextsGetAFolderEachAndAnIndex) {
  nn::manual_seed(4);
  models::BertModel model(tiny_config());
  ScratchDir dir;
  const auto tok = tiny_tokenizer(dir);
  const fs::path out = dir.path() / "out";
  const ModelReport r = write_model_report(model, tok, {"hello", "hellos <b>"}, out.string());
  EXPECT_EQ(r.html, (out / "index.html").string());
  EXPECT_EQ(r.reports, (std::vector<std::string>{(out / "text0" / "report.html").string(),
                                                 (out / "text1" / "report.html").string()}));
  EXPECT_EQ(r.files.size(), 2 * 9u + 1);
  for (const auto& f : r.files) EXPECT_TRUE(fs::is_regular_file(f)) << f;
  EXPECT_EQ(r.tokens[1], (std::vector<std::string>{"[CLS]", "hello", "##s", "[UNK]", "[UNK]",
                                                   "[UNK]", "[SEP]"}));
  const std::string index = read(out / "index.html");
  EXPECT_NE(index.find("<a href=\"text0/report.html\">hello</a>"), std::string::npos) << index;
  EXPECT_NE(index.find("<a href=\"text1/report.html\">hellos &lt;b&gt;</a> <span>(7 tokens)"),
            std::string::npos)
      << index;
  EXPECT_NE(read(out / "text1" / "report.html").find("hellos &lt;b&gt;"), std::string::npos);
}

TEST(ModelReport, BadInputIsRefusedAndWritesNothing) {
  models::BertModel model(tiny_config());
  ScratchDir dir;
  const auto tok = tiny_tokenizer(dir);
  const std::string out = (dir.path() / "out").string();
  expect_error([&] { write_model_report(model, tok, {}, out); },
               {"attn::viz::write_model_report", "texts is empty"});
  expect_error([&] { write_model_report(model, tok, {"hello", " \t"}, out); }, {"text 1 is empty"});
  expect_error([&] { write_model_report(model, tok, {"hello"}, ""); }, {"out_dir is empty"});
  EXPECT_FALSE(fs::exists(out));
  write_bytes(out, "a file");
  expect_error([&] { write_model_report(model, tok, {"hello"}, out); },
               {"out_dir", "exists and is not a folder"});
  // A text longer than the model's positions fails in the forward, before out_dir is created.
  const std::string sub = (dir.path() / "sub").string();
  expect_error(
      [&] {
        write_model_report(model, tok, {"hello", std::string(200, ',')}, sub);
      },
      {"exceed max_position_embeddings"});
  EXPECT_FALSE(fs::exists(sub));
}

}  // namespace
}  // namespace attn::viz
