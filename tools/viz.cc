// attn viz: draw attention weights from a .npy file as a heatmap (PNG or SVG by the output's
// extension).
//   [Lq, Lk]          one heatmap
//   [H, Lq, Lk]       a grid with one panel per head (or one head with --head)
//   [..., H, Lq, Lk]  batch entry --batch (default 0; leading dims flattened, row-major), then as
//   above
//
// attn viz --model DIR --text "..." --out OUT: the report of a pretrained BERT-family model's heads
// on a text, written by attn::viz::write_model_report (include/attn/viz/model_report.h, the same
// code as Python's attn.models.heads_report): OUT/report.html (an overview of layers x heads by
// entropy, then every head with the tokens on both axes) and OUT/layer{l}-head{h}.png and .svg;
// with several --text, OUT/text{i}/ per text and OUT/index.html. Everything is computed before OUT
// is created, so bad input writes nothing.
#include "attn/viz.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/io.h"
#include "attn/models/bert.h"
#include "attn/models/tokenizer.h"
#include "attn/viz/model_report.h"
#include "tools/command.h"

// LeakSanitizer (ASan builds only): Cairo resolves its toy font faces through fontconfig once per
// process and keeps them in static caches that LSan cannot see through; those few hundred bytes are
// reported as leaked at exit. Only allocations made inside libfontconfig are ignored, so leaks of
// attn's own are still caught. Without a sanitizer nothing calls this function.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libfontconfig.so\n";
}

namespace attn::tools {
namespace {

struct VizArgs {
  std::string weights, out, title;
  std::string model;
  std::vector<std::string> texts;
  std::vector<std::string> x_labels, y_labels;
  std::string x_labels_file, y_labels_file;
  int64_t head = -1, batch = 0;
  double vmin = std::numeric_limits<double>::quiet_NaN(),
         vmax = std::numeric_limits<double>::quiet_NaN();
  double cell = 0, scale = 1;
};

// One label per line; a trailing newline and '\r' of CRLF files are dropped, everything else is
// kept.
std::vector<std::string> read_labels(const std::string& path, const char* option) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("attn viz: {}: cannot open '{}'", option, path));
  std::vector<std::string> labels;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(line);
  }
  if (labels.empty()) throw Error(fmt::format("attn viz: {}: '{}' holds no labels", option, path));
  return labels;
}

namespace fs = std::filesystem;

// The checks name the CLI's options; attn::viz::write_model_report (shared with Python's
// attn.models.heads_report) does the rest.
void run_model_viz(const VizArgs& a) {
  if (a.model.empty() || !fs::is_directory(a.model))
    throw Error(fmt::format("attn viz: --model '{}' is not a folder", a.model));
  if (a.texts.empty()) throw Error("attn viz: --model needs --text \"...\" (the text to draw)");
  for (size_t i = 0; i < a.texts.size(); ++i) {
    if (a.texts[i].find_first_not_of(" \t\r\n") == std::string::npos)
      throw Error(
          a.texts.size() == 1
              ? std::string("attn viz: --text is empty: give the text whose attention to draw")
              : fmt::format("attn viz: --text number {} is empty", i + 1));
  }
  if (fs::exists(a.out) && !fs::is_directory(a.out))
    throw Error(fmt::format("attn viz: --out '{}' exists and is not a folder", a.out));

  const auto tokenizer = models::WordPieceTokenizer::from_folder(a.model);
  auto model = models::BertModel::from_pretrained(a.model);
  viz::ModelReportOptions o;
  o.model_path = a.model;
  o.title = a.title;
  const viz::ModelReport r = viz::write_model_report(model, tokenizer, a.texts, a.out, o);
  if (r.reports.size() == 1)
    fmt::print("wrote {} ({} heads as PNG and SVG beside it)\n", r.html, r.layers * r.heads);
  else
    fmt::print("wrote {} ({} texts, {} heads each as PNG and SVG in text0/ ...)\n", r.html,
               r.reports.size(), r.layers * r.heads);
}

void run_viz(const VizArgs& a) {
  if (!a.model.empty() || !a.texts.empty()) {
    if (a.model.empty()) throw Error("attn viz: --text needs --model DIR");
    if (!a.weights.empty()) throw Error("attn viz: give --weights or --model, not both");
    run_model_viz(a);
    return;
  }
  if (a.weights.empty())
    throw Error("attn viz: give --weights W.npy, or --model DIR --text \"...\"");
  // Fail on the output name before reading anything, so that a typo costs nothing.
  viz::format_from_path(a.out, "attn viz: --out");
  Tensor w = read_npy(a.weights);
  if (w.dim() < 2)
    throw Error(fmt::format(
        "attn viz: --weights '{}' must be [Lq, Lk], [H, Lq, Lk] or [..., H, Lq, Lk], got {}",
        a.weights, w.shape_str()));
  // [B1, B2, ..., H, Lq, Lk] (attn sdpa --weights keeps every batch dim): one flat batch index.
  if (w.dim() > 4) w = w.reshape({-1, w.size(-3), w.size(-2), w.size(-1)});
  if (w.dim() == 4) {
    if (a.batch < 0 || a.batch >= w.size(0))
      throw Error(fmt::format("attn viz: --batch {} is out of range for weights {}", a.batch,
                              w.shape_str()));
    w = w.select(0, a.batch);
  } else if (a.batch != 0) {
    throw Error(
        fmt::format("attn viz: --batch needs [..., H, Lq, Lk] weights, got {}", w.shape_str()));
  }
  if (a.head >= 0) {
    if (w.dim() != 3)
      throw Error(fmt::format(
          "attn viz: --head needs [H, Lq, Lk] or [..., H, Lq, Lk] weights, got {}", w.shape_str()));
    if (a.head >= w.size(0))
      throw Error(
          fmt::format("attn viz: --head {} is out of range for {} heads", a.head, w.size(0)));
    w = w.select(0, a.head);
  }

  viz::HeatmapOptions o;
  o.title = a.title;
  o.x_labels =
      a.x_labels_file.empty() ? a.x_labels : read_labels(a.x_labels_file, "--x-labels-file");
  o.y_labels =
      a.y_labels_file.empty() ? a.y_labels : read_labels(a.y_labels_file, "--y-labels-file");
  o.vmin = a.vmin;
  o.vmax = a.vmax;
  o.cell_px = a.cell;
  o.scale = a.scale;
  if (w.dim() == 2)
    viz::write_heatmap(a.out, w, o);
  else
    viz::write_head_grid(a.out, w, o);
  fmt::print("wrote {}\n", a.out);
}

void add_viz_command(CLI::App& app) {
  auto args = std::make_shared<VizArgs>();
  CLI::App* cmd = app.add_subcommand(
      "viz",
      "Draw attention weights (.npy) as a heatmap: PNG or SVG; or, with --model and --text, an "
      "HTML report of a pretrained model's heads");
  cmd->add_option("--weights", args->weights,
                  "weights [Lq, Lk], [H, Lq, Lk] or [..., H, Lq, Lk] (.npy)");
  cmd->add_option("--model", args->model,
                  "a HuggingFace BERT-family folder (config.json, model.safetensors, tokenizer)");
  cmd->add_option("--text", args->texts,
                  "with --model: the text whose attention to draw (repeatable: OUT/text{i}/ per "
                  "text and OUT/index.html)")
      ->allow_extra_args(false);
  cmd->add_option("--out", args->out,
                  "output file, .png or .svg; with --model a folder (report.html, one PNG and SVG "
                  "per head)")
      ->required();
  cmd->add_option("--x-labels", args->x_labels, "key tokens, comma-separated (one per key)")
      ->delimiter(',');
  cmd->add_option("--y-labels", args->y_labels, "query tokens, comma-separated (one per query)")
      ->delimiter(',');
  cmd->add_option("--x-labels-file", args->x_labels_file, "key tokens, one per line")
      ->excludes("--x-labels");
  cmd->add_option("--y-labels-file", args->y_labels_file, "query tokens, one per line")
      ->excludes("--y-labels");
  cmd->add_option("--title", args->title, "title above the picture");
  cmd->add_option("--head", args->head, "draw only this head (default: a grid of every head)");
  cmd->add_option("--batch", args->batch,
                  "batch entry of [..., H, Lq, Lk] weights, leading dims flattened (default 0)");
  cmd->add_option("--vmin", args->vmin,
                  "colour range low end (default 0, widened to the data when needed)")
      ->check(finite_number());
  cmd->add_option("--vmax", args->vmax,
                  "colour range high end (default 1, widened to the data when needed)")
      ->check(finite_number());
  cmd->add_option("--cell", args->cell, "cell size in pixels (default: from the number of tokens)");
  cmd->add_option("--scale", args->scale,
                  "pixel density of PNG output (2 = sharp on high-DPI screens)");
  cmd->callback([args] { run_viz(*args); });
}

Command reg{"viz", 50, &add_viz_command};

}  // namespace
}  // namespace attn::tools
