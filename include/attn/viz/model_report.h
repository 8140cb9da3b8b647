// attn::viz::write_model_report: the HTML report of a pretrained BERT-family model's heads, the
// one that `attn viz --model DIR --text ... --out OUT` and Python's attn.models.heads_report write.
//
// Each text goes through the folder's WordPiece tokenizer (truncated to its model_max_length) and
// BertModel::forward(output_attentions); its report is the demo's report builder in the per-head
// layout (an overview of layers x heads by mean row entropy, then every head with the tokens on
// both axes) and each head [L, L] on its own as PNG and SVG:
//
//   one text     OUT/report.html, OUT/layer{l}-head{h}.png, OUT/layer{l}-head{h}.svg
//   N > 1 texts  OUT/text{i}/ holding the same for text i, and OUT/index.html linking to them
//
// Everything is tokenized, computed and rendered before OUT is created, so bad input writes
// nothing; every file is written atomically. This is the one place that joins attn::models and
// attn::viz (viz is a frontend, models sits below it; viz.h itself knows nothing of models).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/models/bert.h"
#include "attn/models/tokenizer.h"

namespace attn::viz {

struct ModelReportOptions {
  // Where the model came from, as the user named it: the summary's "model" row, and (its folder's
  // name) the default title. Empty: no "model" row, the title is "attn viz: model".
  std::string model_path;
  std::string title;  // empty = "attn viz: <folder name>"
  // Pixel density of the per-head PNG files (the report's own images are always drawn at 2).
  double png_scale = 2;
};

// What was written, with each text's tokens and per-head entropy.
struct ModelReport {
  std::string html;                  // OUT/report.html (one text) or OUT/index.html
  std::vector<std::string> reports;  // OUT/report.html or OUT/text{i}/report.html, per text
  std::vector<std::string> files;    // every file written, in writing order
  int64_t layers = 0, heads = 0;
  std::vector<std::vector<std::string>> tokens;           // per text, [CLS] ... [SEP]
  std::vector<std::vector<std::vector<double>>> entropy;  // per text [layer][head], nats
};

// texts must be non-empty and each must hold a non-space character; out_dir must be a folder or
// not exist yet. Throws attn::Error starting with "attn::viz::write_model_report: " otherwise, or
// with the model's or the tokenizer's error.
ModelReport write_model_report(models::BertModel& model,
                               const models::WordPieceTokenizer& tokenizer,
                               const std::vector<std::string>& texts, const std::string& out_dir,
                               const ModelReportOptions& options = {});

}  // namespace attn::viz
