// The model report (include/attn/viz/model_report.h): tokenize, run the model with its attentions,
// feed the report builder in its per-head layout, and write one PNG and SVG per head.
#include "attn/viz/model_report.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "attn/error.h"
#include "attn/viz.h"
#include "viz/canvas.h"

namespace attn::viz {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFn = "attn::viz::write_model_report";

// One text's files (name relative to its folder -> bytes), rendered before anything is written.
struct TextReport {
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> tokens;
  std::vector<std::vector<double>> entropy;  // [layer][head]
};

std::string folder_name(const std::string& path) {
  if (path.empty()) return "model";
  std::error_code ec;
  const fs::path p = fs::canonical(path, ec);
  const fs::path named = ec ? fs::path(path).lexically_normal() : p;
  std::string name = named.filename().string();
  if (name.empty()) name = named.parent_path().filename().string();
  return name.empty() ? path : name;
}

TextReport render_text(models::BertModel& model, const models::WordPieceTokenizer& tokenizer,
                       const std::string& text, const ModelReportOptions& o) {
  const models::Encoding enc = tokenizer.encode(text);
  const auto L = static_cast<int64_t>(enc.ids.size());
  Tensor ids = Tensor::empty({1, L}, DType::i64), types = Tensor::empty({1, L}, DType::i64);
  for (int64_t j = 0; j < L; ++j) {
    ids.data_as<int64_t>()[j] = enc.ids[static_cast<size_t>(j)];
    types.data_as<int64_t>()[j] = enc.type_ids[static_cast<size_t>(j)];
  }
  const models::BertOutput out =
      model.forward(ids, Tensor::full({1, L}, 1, DType::i64), types, /*output_attentions=*/true);

  ReportData report;
  report.title = o.title.empty() ? "attn viz: " + folder_name(o.model_path) : o.title;
  report.subtitle = fmt::format("{} layers x {} heads on {} tokens", out.attentions.size(),
                                out.attentions.empty() ? 0 : out.attentions[0].size(1), L);
  if (!o.model_path.empty()) report.summary.emplace_back("model", o.model_path);
  report.summary.emplace_back("text", text);
  report.summary.emplace_back("tokens", std::to_string(L));
  report.head_layout = HeadLayout::per_head;
  report.training_sections = false;
  TextReport r;
  r.tokens = enc.tokens;
  for (size_t l = 0; l < out.attentions.size(); ++l) {
    LayerAttention la;
    la.name = fmt::format("layer {}", l);
    la.weights = out.attentions[l].select(0, 0);  // [H, L, L] of the one text
    la.q_tokens = enc.tokens;
    la.k_tokens = enc.tokens;
    HeadEntropy e;
    e.layer = la.name;
    e.nats = mean_row_entropy(la.weights);
    e.max_nats = std::log(static_cast<double>(L));
    for (int64_t h = 0; h < la.weights.size(0); ++h) {
      HeatmapOptions ho;
      ho.title = fmt::format("layer {} head {} (entropy {:.3f} nats)", l, h,
                             e.nats[static_cast<size_t>(h)]);
      ho.x_labels = ho.y_labels = enc.tokens;
      ho.scale = o.png_scale;
      const Tensor w = la.weights.select(0, h);
      const std::string stem = fmt::format("layer{}-head{}", l, h);
      r.files.emplace_back(stem + ".png", render_heatmap(w, ho, ImageFormat::png));
      r.files.emplace_back(stem + ".svg", render_heatmap(w, ho, ImageFormat::svg));
    }
    r.entropy.push_back(e.nats);
    report.layers.push_back(std::move(la));
    report.entropy.push_back(std::move(e));
  }
  r.files.emplace_back("report.html", render_report(report));
  return r;
}

// OUT/index.html of a several-text report: one line per text, linking to its report.
std::string index_html(const std::string& title, const std::vector<std::string>& texts,
                       const std::vector<std::vector<std::string>>& tokens, int64_t layers,
                       int64_t heads) {
  using detail::xml_escape;
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{0}</title>\n"
      "<style>body {{ font-family: system-ui, sans-serif; margin: 24px; color: #1f2328; }} "
      "li {{ margin: 6px 0; }} span {{ color: #59636e; }}</style>\n</head>\n<body>\n<h1>{0}</h1>\n"
      "<p>{1} layers x {2} heads; one report per text.</p>\n<ol start=\"0\">\n",
      xml_escape(title), layers, heads);
  for (size_t i = 0; i < texts.size(); ++i)
    out += fmt::format("<li><a href=\"text{}/report.html\">{}</a> <span>({} tokens)</span></li>\n",
                       i, xml_escape(texts[i]), tokens[i].size());
  return out + "</ol>\n</body>\n</html>\n";
}

}  // namespace

ModelReport write_model_report(models::BertModel& model,
                               const models::WordPieceTokenizer& tokenizer,
                               const std::vector<std::string>& texts, const std::string& out_dir,
                               const ModelReportOptions& options) {
  if (texts.empty()) throw Error(fmt::format("{}: texts is empty: give at least one text", kFn));
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].find_first_not_of(" \t\r\n") == std::string::npos)
      throw Error(fmt::format("{}: text {} is empty (or only spaces)", kFn, i));
  }
  if (out_dir.empty()) throw Error(fmt::format("{}: out_dir is empty", kFn));
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    throw Error(fmt::format("{}: out_dir '{}' exists and is not a folder", kFn, out_dir));

  std::vector<TextReport> rendered;
  rendered.reserve(texts.size());
  for (const std::string& text : texts)
    rendered.push_back(render_text(model, tokenizer, text, options));

  ModelReport result;
  result.layers = model.config().num_hidden_layers;
  result.heads = model.config().num_attention_heads;
  const bool one = texts.size() == 1;
  std::vector<std::pair<std::string, const std::string*>> files;  // path relative to OUT -> bytes
  for (size_t i = 0; i < rendered.size(); ++i) {
    const std::string dir = one ? "" : fmt::format("text{}/", i);
    for (const auto& [name, bytes] : rendered[i].files) files.emplace_back(dir + name, &bytes);
    result.reports.push_back((fs::path(out_dir) / (dir + "report.html")).string());
    result.tokens.push_back(std::move(rendered[i].tokens));
    result.entropy.push_back(std::move(rendered[i].entropy));
  }
  std::string index;
  if (!one) {
    const std::string title =
        options.title.empty() ? "attn viz: " + folder_name(options.model_path) : options.title;
    index = index_html(title, texts, result.tokens, result.layers, result.heads);
    files.emplace_back("index.html", &index);
  }
  result.html = one ? result.reports[0] : (fs::path(out_dir) / "index.html").string();

  for (const auto& [name, bytes] : files) {
    const fs::path path = fs::path(out_dir) / name;
    fs::create_directories(path.parent_path());
    write_file_atomically(path.string(), *bytes, kFn);
    result.files.push_back(path.string());
  }
  return result;
}

}  // namespace attn::viz
