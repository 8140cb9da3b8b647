// The HTML training report: one file, no scripts and no network. Heatmaps are base64 PNG data URIs
// (drawn at twice the pixel density, shown at their natural size), charts inline SVG, styles
// inline.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/error.h"
#include "attn/viz.h"
#include "viz/canvas.h"
#include "viz/chart.h"

namespace attn::viz {
namespace {

using detail::xml_escape;

constexpr const char* kStyle = R"css(
:root { --ink:#1f2328; --muted:#59636e; --line:#d8dee4; --card:#ffffff; --page:#f4f6f8; --accent:#3b6fb6; }
* { box-sizing: border-box; }
body { margin:0; background:var(--page); color:var(--ink);
       font: 15px/1.5 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 28px 24px 60px; }
header h1 { margin: 0 0 4px; font-size: 28px; }
header p { margin: 0; color: var(--muted); }
nav { margin: 18px 0 8px; display:flex; flex-wrap:wrap; gap:8px; }
nav a { color: var(--accent); text-decoration:none; border:1px solid var(--line); background:var(--card);
        border-radius: 14px; padding: 2px 12px; font-size: 13px; }
section { background: var(--card); border:1px solid var(--line); border-radius: 10px; padding: 18px 22px;
          margin: 18px 0; }
section h2 { margin: 0 0 12px; font-size: 20px; }
section h3 { margin: 18px 0 6px; font-size: 16px; }
p.note { color: var(--muted); margin: 4px 0 12px; font-size: 13px; }
table { border-collapse: collapse; }
td, th { padding: 5px 14px 5px 0; text-align: left; border-bottom: 1px solid var(--line); vertical-align: middle; }
th { color: var(--muted); font-weight: normal; font-size: 13px; }
table.summary td:first-child { color: var(--muted); }
table.summary td:last-child { font-weight: bold; font-variant-numeric: tabular-nums; }
.charts { display:flex; flex-wrap: wrap; gap: 14px; }
svg.chart { border: 1px solid var(--line); border-radius: 6px; max-width: 100%; height: auto; }
svg.chart text { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; font-size: 11px; fill: #444; }
svg.chart .chart-title { font-size: 14px; font-weight: bold; fill: var(--ink); }
svg.chart .axis-title { fill: var(--muted); }
svg.chart .grid line { stroke: #e6e9ec; stroke-width: 1; }
figure { margin: 8px 0 18px; overflow-x: auto; }
figure img { display:block; max-width: none; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.bar { display:inline-block; height: 10px; background: var(--accent); border-radius: 3px; vertical-align: middle; }
.barbox { display:inline-block; width: 160px; height: 10px; background: #eef1f4; border-radius: 3px; }
.flag { font-size: 12px; border-radius: 10px; padding: 1px 9px; white-space: nowrap; }
.flag.onehot { background: #fde8d4; color: #8a3d00; }
.flag.uniform { background: #e3e9f5; color: #2b4c86; }
.num { font-variant-numeric: tabular-nums; }
table.overview td, table.overview th { padding: 2px; border: 0; text-align: center; }
table.overview a { display:block; min-width: 52px; padding: 3px 4px; border-radius: 4px; text-decoration:none;
                   font-size: 12px; font-variant-numeric: tabular-nums; }
table.overview a.onehot { outline: 2px solid #d9822b; }
table.overview a.uniform { outline: 2px solid #3b6fb6; }
.heads { display:flex; flex-wrap: wrap; gap: 6px 18px; }
.heads figure:target { outline: 3px solid var(--accent); outline-offset: 4px; }
p.tokens { font-family: "DejaVu Sans Mono", monospace; font-size: 13px; }
)css";

std::string section(const char* id, const std::string& heading, const std::string& body) {
  return fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n{}</section>\n", id, xml_escape(heading),
                     body);
}

std::string empty_note(const char* what) {
  return fmt::format("<p class=\"note\">No {} recorded.</p>\n", what);
}

// Charts grouped by the part of a series name before '/'.
std::map<std::string, std::map<std::string, Curve>> group_charts(
    const std::map<std::string, Curve>& series) {
  std::map<std::string, std::map<std::string, Curve>> charts;
  for (const auto& [name, curve] : series) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos)
      charts[name][name] = curve;
    else
      charts[name.substr(0, slash)][name.substr(slash + 1)] = curve;
  }
  return charts;
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string charts_html(
    const std::vector<std::pair<std::string, const std::map<std::string, Curve>*>>& charts) {
  std::string out = "<div class=\"charts\">\n";
  for (const auto& [title, lines] : charts)
    out += detail::line_chart_svg(title, *lines, /*allow_log=*/!starts_with(title, "acc"));
  return out + "</div>\n";
}

// Width in pixels of a PNG (from its IHDR chunk).
double png_width(const std::string& png) {
  if (png.size() < 24) return 0;
  uint32_t w = 0;
  for (int k = 16; k < 20; ++k) w = (w << 8) | static_cast<unsigned char>(png[k]);
  return w;
}

std::string join_tokens(const std::vector<std::string>& tokens) {
  std::string s;
  for (size_t i = 0; i < tokens.size(); ++i) s += (i ? " " : "") + tokens[i];
  return s;
}

void check_layer(const LayerAttention& layer, size_t l) {
  if (!layer.weights.defined() || layer.weights.dim() != 3)
    throw Error(fmt::format(
        "attn::viz::render_report: layers[{}] ('{}') weights must be [H, Lq, Lk], got {}", l,
        layer.name, layer.weights.defined() ? layer.weights.shape_str() : "undefined"));
}

// "onehot", "uniform" or "" for a head of mean row entropy v over rows of max_nats = log(keys).
const char* flag_of(const ReportData& data, double v, double max_nats) {
  if (v < data.one_hot_below_nats) return "onehot";
  if (max_nats > 0 && v > data.uniform_above_fraction * max_nats) return "uniform";
  return "";
}

std::string flag_html(const char* flag) {
  if (flag == std::string("onehot")) return "<span class=\"flag onehot\">near one-hot</span>";
  if (flag == std::string("uniform")) return "<span class=\"flag uniform\">near uniform</span>";
  return "";
}

std::string img_html(const std::string& png, double scale, const std::string& alt) {
  return fmt::format("<img width=\"{:.0f}\" src=\"data:image/png;base64,{}\" alt=\"{}\">",
                     png_width(png) / scale, base64_encode(png), xml_escape(alt));
}

// HeadLayout::per_head: an overview (layers x heads, linking to each head) and a figure per head.
std::string per_head_html(const ReportData& data) {
  struct Head {
    double nats, max_nats;
    const char* flag;
  };
  std::vector<std::vector<Head>> heads(data.layers.size());
  int64_t max_h = 0;
  for (size_t l = 0; l < data.layers.size(); ++l) {
    const LayerAttention& layer = data.layers[l];
    check_layer(layer, l);
    const double max_nats =
        std::log(static_cast<double>(std::max<int64_t>(layer.weights.size(2), 1)));
    for (double v : mean_row_entropy(layer.weights))
      heads[l].push_back({v, max_nats, flag_of(data, v, max_nats)});
    max_h = std::max(max_h, layer.weights.size(0));
  }

  std::string out =
      "<h3>Overview</h3>\n<p class=\"note\">Mean row entropy of every head (nats; brighter = "
      "more spread out). Pick a head to jump to its heatmap. Outlined: <span class=\"flag "
      "onehot\">near one-hot</span> or <span class=\"flag uniform\">near uniform</span>.</p>\n"
      "<table class=\"overview\">\n<tr><th></th>";
  for (int64_t h = 0; h < max_h; ++h) out += fmt::format("<th>head {}</th>", h);
  out += "</tr>\n";
  for (size_t l = 0; l < heads.size(); ++l) {
    out += fmt::format("<tr><th>{}</th>", xml_escape(data.layers[l].name));
    for (size_t h = 0; h < heads[l].size(); ++h) {
      const Head& e = heads[l][h];
      const double frac = e.max_nats > 0 ? std::clamp(e.nats / e.max_nats, 0.0, 1.0) : 0;
      const Rgb bg = colormap(frac);
      out += fmt::format(
          "<td><a class=\"{}\" href=\"#l{}-h{}\" style=\"background:{};color:{}\">{:.3f}</a></td>",
          e.flag, l, h, to_hex(bg), relative_luminance(bg) > 0.35 ? "#1f2328" : "#ffffff", e.nats);
    }
    out += "</tr>\n";
  }
  out += "</table>\n";

  for (size_t l = 0; l < data.layers.size(); ++l) {
    const LayerAttention& layer = data.layers[l];
    out += fmt::format("<h3 id=\"l{}\">{}</h3>\n", l, xml_escape(layer.name));
    if (!layer.q_tokens.empty())
      out += fmt::format("<p class=\"tokens\">queries: {}</p>\n",
                         xml_escape(join_tokens(layer.q_tokens)));
    if (!layer.k_tokens.empty() && layer.k_tokens != layer.q_tokens)
      out += fmt::format("<p class=\"tokens\">keys: {}</p>\n",
                         xml_escape(join_tokens(layer.k_tokens)));
    out += "<div class=\"heads\">\n";
    HeatmapOptions o;  // no title: the caption names the head
    o.x_labels = layer.k_tokens;
    o.y_labels = layer.q_tokens;
    o.scale = 2;
    for (int64_t h = 0; h < layer.weights.size(0); ++h) {
      const Head& e = heads[l][h];
      const std::string png = render_heatmap(layer.weights.select(0, h), o, ImageFormat::png);
      out += fmt::format(
          "<figure id=\"l{0}-h{1}\" data-layer=\"{0}\" data-head=\"{1}\" "
          "data-entropy=\"{2:.7f}\">{3}"
          "\n<figcaption>{4} &middot; head {1} &middot; entropy <span class=\"num\">{2:.4f}</span> "
          "nats ({5:.0f}% of uniform) {6}</figcaption></figure>\n",
          l, h, e.nats,
          img_html(png, o.scale, fmt::format("attention weights of {}, head {}", layer.name, h)),
          xml_escape(layer.name), e.max_nats > 0 ? 100 * e.nats / e.max_nats : 0,
          flag_html(e.flag));
    }
    out += "</div>\n";
  }
  return out;
}

std::string heatmaps_html(const ReportData& data) {
  if (data.layers.empty()) return empty_note("attention weights");
  if (data.head_layout == HeadLayout::per_head) return per_head_html(data);
  std::string out =
      "<p class=\"note\">Each panel is one head: row i shows how query token i spreads its "
      "attention over the key "
      "tokens (columns); brighter is more weight, each row sums to 1.</p>\n";
  for (size_t l = 0; l < data.layers.size(); ++l) {
    const LayerAttention& layer = data.layers[l];
    check_layer(layer, l);
    HeatmapOptions o;  // no title: the heading above names the layer
    o.x_labels = layer.k_tokens;
    o.y_labels = layer.q_tokens;
    o.scale = 2;
    const std::string png = render_head_grid(layer.weights, o, ImageFormat::png);
    out += fmt::format(
        "<h3>{0}</h3>\n<figure><img width=\"{1:.0f}\" src=\"data:image/png;base64,{2}\" "
        "alt=\"attention weights of "
        "{0}, one panel per head\">\n<figcaption>{3} heads, {4} queries &times; {5} "
        "keys{6}</figcaption></figure>\n",
        xml_escape(layer.name), png_width(png) / o.scale, base64_encode(png), layer.weights.size(0),
        layer.weights.size(1), layer.weights.size(2),
        layer.q_tokens.empty() ? "" : "; queries: " + xml_escape(join_tokens(layer.q_tokens)));
  }
  return out;
}

std::string entropy_html(const ReportData& data) {
  if (data.entropy.empty()) return empty_note("head entropies");
  std::string out = fmt::format(
      "<p class=\"note\">Mean entropy of each head's attention rows (natural log). A row spread "
      "evenly over n keys "
      "has log n; a row on a single key has 0. Flagged: <span class=\"flag onehot\">near "
      "one-hot</span> below "
      "{:g} nats, <span class=\"flag uniform\">near uniform</span> above {:g}% of log n.</p>\n"
      "<table class=\"entropy\">\n<tr><th>layer</th><th>head</th><th>entropy (nats)</th><th>of "
      "uniform</th>"
      "<th></th></tr>\n",
      data.one_hot_below_nats, data.uniform_above_fraction * 100);
  for (const HeadEntropy& e : data.entropy) {
    for (size_t h = 0; h < e.nats.size(); ++h) {
      const double v = e.nats[h];
      const double frac = e.max_nats > 0 ? std::clamp(v / e.max_nats, 0.0, 1.0) : 0;
      const std::string flag = flag_html(flag_of(data, v, e.max_nats));
      out += fmt::format(
          "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.3f}</td><td><span "
          "class=\"barbox\">"
          "<span class=\"bar\" style=\"width:{:.1f}%;background:{}\"></span></span> <span "
          "class=\"num\">{:.0f}%"
          "</span></td><td>{}</td></tr>\n",
          xml_escape(e.layer), h, v, frac * 100, to_hex(colormap(0.15 + 0.7 * frac)), frac * 100,
          flag);
    }
  }
  return out + "</table>\n";
}

}  // namespace

std::vector<double> mean_row_entropy(const Tensor& weights) {
  if (!weights.defined() || weights.dim() != 3)
    throw Error(fmt::format("attn::viz::mean_row_entropy: weights must be [H, Lq, Lk], got {}",
                            weights.defined() ? weights.shape_str() : "an undefined tensor"));
  const int64_t H = weights.size(0), Lq = weights.size(1), Lk = weights.size(2);
  const std::vector<double> w = weights.to_vector();
  std::vector<double> out(H, 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double sum = 0;
    int64_t rows = 0;
    for (int64_t i = 0; i < Lq; ++i) {
      const double* row = w.data() + (h * Lq + i) * Lk;
      double mass = 0, ent = 0;
      for (int64_t j = 0; j < Lk; ++j) {
        mass += row[j];
        if (row[j] > 0) ent -= row[j] * std::log(row[j]);
      }
      if (std::isnan(mass)) ent = mass;  // NaN weights (a diverged run): no entropy, not 0
      if (mass <= 0) continue;           // a fully masked row has no distribution
      sum += ent;
      ++rows;
    }
    // A head with no distribution at all has no entropy either (0 read as "near one-hot").
    out[h] = rows ? sum / rows : std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

std::string render_report(const ReportData& data) {
  const auto charts = group_charts(data.series);
  std::vector<std::pair<std::string, const std::map<std::string, Curve>*>> training, gradients,
      more;
  for (const auto& [name, lines] : charts) {
    if (starts_with(name, "loss") || starts_with(name, "acc"))
      training.emplace_back(name, &lines);
    else if (starts_with(name, "grad"))
      gradients.emplace_back(name, &lines);
    else
      more.emplace_back(name, &lines);
  }
  // Loss before accuracy.
  std::stable_sort(training.begin(), training.end(), [](const auto& a, const auto& b) {
    return starts_with(a.first, "loss") > starts_with(b.first, "loss");
  });

  std::string summary;
  if (data.summary.empty()) {
    summary = empty_note("summary values");
  } else {
    summary = "<table class=\"summary\">\n";
    for (const auto& [k, v] : data.summary)
      summary += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", xml_escape(k), xml_escape(v));
    summary += "</table>\n";
  }

  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, "
      "initial-scale=1\">\n<title>{0}</title>\n"
      "<style>{1}</style>\n</head>\n<body>\n<main>\n<header><h1>{0}</h1><p>{2}written by attn "
      "&middot; one file, "
      "nothing loaded from the network</p></header>\n<nav><a href=\"#summary\">summary</a>{3}"
      "<a href=\"#attention\">attention heatmaps</a>"
      "<a href=\"#entropy\">head entropy</a></nav>\n",
      xml_escape(data.title), kStyle,
      data.subtitle.empty() ? "" : xml_escape(data.subtitle) + " &middot; ",
      data.training_sections ? "<a href=\"#training\">loss &amp; accuracy</a><a "
                               "href=\"#gradients\">gradient norms</a>"
                             : "");
  html += section("summary", "Summary", summary);
  if (data.training_sections) {
    html +=
        section("training", "Loss and accuracy",
                training.empty() ? empty_note("loss or accuracy curves") : charts_html(training));
    html += section("gradients", "Gradient norms",
                    gradients.empty() ? empty_note("gradient norms") : charts_html(gradients));
  }
  if (!more.empty()) html += section("more-curves", "More curves", charts_html(more));
  html += section("attention", "Attention heatmaps", heatmaps_html(data));
  html += section("entropy", "Head entropy", entropy_html(data));
  html += "</main>\n</body>\n</html>\n";
  return html;
}

void write_report(const std::string& path, const ReportData& data) {
  write_file_atomically(path, render_report(data), "attn::viz::write_report");
}

}  // namespace attn::viz
