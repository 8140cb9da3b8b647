// attn::viz: pictures of attention weights and a self-contained HTML training report.
//
// Heatmaps are drawn with Cairo by one piece of drawing code on two surfaces (PNG and SVG): queries
// down the y axis, keys along the x axis, the tokens as axis labels, a colour bar with ticks and a
// title. The colour map is a perceptual one computed here (lightness rises linearly from dark
// violet to yellow, like viridis), so the eye reads "brighter = more weight". NaN and +-inf cells
// are drawn in a colour the map never uses, and the legend says so; values outside the colour range
// are clamped to its ends and the colour bar grows a triangle on that side.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.h"

namespace attn::viz {

// ---- colour map --------------------------------------------------------------------------------

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};
// The perceptual map at t in [0, 1] (t outside is clamped; NaN gives nan_colour()). Lightness
// (CIELAB L*) grows linearly in t, so the map is monotone in luminance and prints sensibly in grey.
Rgb colormap(double t);
// The colour of NaN / +-inf cells: a pink that the map never comes near.
Rgb nan_colour();
// Relative luminance Y (0..1) of an sRGB colour, for tests and for choosing a readable text colour.
double relative_luminance(Rgb c);
// "#rrggbb"
std::string to_hex(Rgb c);

// ---- heatmaps ----------------------------------------------------------------------------------

enum class ImageFormat { png, svg };
// .png or .svg (case-insensitive) from a file name; throws attn::Error naming `what` otherwise.
ImageFormat format_from_path(const std::string& path, const char* what);

struct HeatmapOptions {
  std::string title;                  // drawn above the picture; empty = none
  std::vector<std::string> x_labels;  // one per key (Lk) or empty (indices are shown)
  std::vector<std::string> y_labels;  // one per query (Lq) or empty (indices are shown)
  std::string x_axis = "key";         // axis titles
  std::string y_axis = "query";
  // Colour range. NaN = automatic: [0, 1] for attention weights, with two exceptions: values
  // outside [0, 1] widen it to the data (the legend says so), and when 90% of the rows peak at 0.5
  // or less (long rows spread thin) the top comes down to that peak rounded up to 1, 2, 2.5 or
  // 5 x 10^k, so that the pattern stays visible (brighter cells are clamped to the top colour and
  // the colour bar's top triangle shows it).
  double vmin = std::numeric_limits<double>::quiet_NaN();
  double vmax = std::numeric_limits<double>::quiet_NaN();
  // Side of one cell in pixels; 0 = chosen from the number of tokens (36 px for a few tokens, 1 px
  // at 512+).
  double cell_px = 0;
  // Pixel density of PNG output (2 = sharp on high-DPI screens); SVG ignores it.
  double scale = 1;
};

// weights [Lq, Lk] -> encoded image bytes (PNG or SVG). Any dtype (converted to double).
std::string render_heatmap(const Tensor& weights, const HeatmapOptions& options,
                           ImageFormat format);
// weights [H, Lq, Lk] -> one picture, one panel per head labelled "head h", one shared colour bar.
std::string render_head_grid(const Tensor& weights, const HeatmapOptions& options,
                             ImageFormat format);

// The same, written to `path` (format from the extension). The file appears whole or not at all:
// the bytes go to a temporary file in the same folder, renamed over `path` at the end.
void write_heatmap(const std::string& path, const Tensor& weights, const HeatmapOptions& options);
void write_head_grid(const std::string& path, const Tensor& weights, const HeatmapOptions& options);

// ---- HTML report -------------------------------------------------------------------------------

using Curve = std::vector<std::pair<double, double>>;  // (step, value), in step order

// The attention of one layer on one example sequence.
struct LayerAttention {
  std::string name;                   // "layer 0 (encoder self-attention)"
  Tensor weights;                     // [H, Lq, Lk]
  std::vector<std::string> q_tokens;  // Lq labels (may be empty)
  std::vector<std::string> k_tokens;  // Lk labels (may be empty)
};

// Mean entropy (natural log) of the attention rows of every head.
struct HeadEntropy {
  std::string layer;         // layer name, as in LayerAttention::name
  std::vector<double> nats;  // [H]
  double max_nats = 0;       // log(number of keys): the entropy of a uniform row
};

// How the attention section draws the heads.
enum class HeadLayout {
  // One picture per layer with a panel per head (the training report of `attn train` / `attn demo`).
  layer_grid,
  // An overview table (layers x heads, each cell the head's entropy, coloured and flagged, linking
  // to the head) and one picture per head with the tokens on both axes, each in a <figure
  // id="l{layer}-h{head}" data-layer data-head data-entropy> (the model report of `attn viz
  // --model`). Still no scripts: the overview picks a head by its #anchor.
  per_head,
};

struct ReportData {
  std::string title = "attn report";
  // Shown under the title (e.g. the model folder and the text); empty = the default line.
  std::string subtitle;
  // Free-form summary, shown as a table in this order ("task" -> "reverse", "held-out accuracy" ->
  // "0.997").
  std::vector<std::pair<std::string, std::string>> summary;
  // Curves by name. "chart/line" puts the line into the chart "chart" (e.g. "loss/train",
  // "loss/held-out"); a name without '/' is a chart of its own. Charts named loss* and acc* go to
  // the training section, grad* to the gradient-norm section, the rest to "more curves". A chart's
  // y axis is logarithmic when its values are positive and span more than two decades, except acc*
  // charts (always linear).
  std::map<std::string, Curve> series;
  std::vector<LayerAttention> layers;
  std::vector<HeadEntropy> entropy;
  HeadLayout head_layout = HeadLayout::layer_grid;
  // false: no loss / gradient sections (a pretrained model has no training curves).
  bool training_sections = true;
  // A head is flagged near-one-hot when its mean row entropy is below one_hot_below_nats,
  // near-uniform when above uniform_above_fraction * max_nats.
  double one_hot_below_nats = 0.2;
  double uniform_above_fraction = 0.9;
};

// Mean over query rows of -sum_j p_ij log p_ij for weights [H, Lq, Lk]; rows that sum to 0 (fully
// masked) are left out. Returns [H] in nats; NaN for a head with a NaN weight or with no row left
// (the report then flags it neither one-hot nor uniform).
std::vector<double> mean_row_entropy(const Tensor& weights);

// The whole report as one HTML document: no scripts, no network (heatmaps are base64 PNG data URIs,
// charts inline SVG).
std::string render_report(const ReportData& data);
// Written atomically like write_heatmap.
void write_report(const std::string& path, const ReportData& data);

// ---- small helpers (public because the tool and tests use them) ---------------------------------

std::string base64_encode(const std::string& bytes);
// Writes `bytes` to `path` through a temporary file in the same folder and a rename; `what` names
// the caller in error messages.
void write_file_atomically(const std::string& path, const std::string& bytes, const char* what);

}  // namespace attn::viz
