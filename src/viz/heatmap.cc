// Heatmaps of attention weights: one map [Lq, Lk] or a grid of heads [H, Lq, Lk], as PNG or SVG.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "attn/error.h"
#include "attn/viz.h"
#include "viz/canvas.h"
#include "viz/heatmap_layout.h"

namespace attn::viz {
namespace detail {
namespace {

constexpr double kMargin = 16;
constexpr double kTitleFont = 15;
constexpr double kPanelTitleFont = 12;
constexpr double kAxisTitleFont = 11;
constexpr double kTickLength = 4;
constexpr double kBarWidth = 14;
constexpr double kTriangle = 10;  // height of the out-of-range triangles on the colour bar
constexpr Rgb kInk{34, 34, 34};
constexpr Rgb kMutedInk{90, 90, 90};
constexpr int64_t kMaxTokens = 16384;
constexpr double kMaxSide = 30000;  // pixels; Cairo's image surfaces stop at 32767
constexpr int64_t kSvgRectCells =
    4096;  // above this many cells an SVG embeds the cells as one image

// 1, 2, 5, 10, 20, 50, ... : the smallest of these >= n.
int64_t nice_step(int64_t n) {
  for (int64_t base = 1;; base *= 10)
    for (int64_t m : {1, 2, 5})
      if (m * base >= n) return m * base;
}

// Keeps at most 14 characters (code points) of a label, then an ellipsis.
std::string shorten(const std::string& s) {
  constexpr int kMaxChars = 14;
  int chars = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // UTF-8 continuation byte
    if (chars == kMaxChars) return s.substr(0, i) + "\u2026";
    ++chars;
  }
  return s;
}

AxisLabels make_labels(const std::vector<std::string>& given, int64_t n, double cell,
                       bool may_turn) {
  AxisLabels a;
  a.text.resize(n);
  for (int64_t i = 0; i < n; ++i) a.text[i] = given.empty() ? std::to_string(i) : shorten(given[i]);
  a.font = std::clamp(cell * 0.7, 9.0, 12.0);
  const int64_t stacked_step = nice_step(static_cast<int64_t>(std::ceil(a.font * 1.3 / cell)));
  double widest = 0;
  for (int64_t i = 0; i < n; ++i) widest = std::max(widest, text_width(a.text[i], a.font));
  if (may_turn && widest + 4 > cell) {
    a.vertical = true;
  }
  // Labels side by side along the axis (y labels, or turned x labels) need font-height spacing; x
  // labels that stay horizontal fit in their cells by construction.
  a.step = (!may_turn || a.vertical) ? stacked_step : 1;
  double shown = 0;
  for (int64_t i = 0; i < n; i += a.step) shown = std::max(shown, text_width(a.text[i], a.font));
  a.extent = (may_turn && !a.vertical) ? a.font * 1.2 : shown;
  return a;
}

double round_up_nicely(double v) {
  const double p = std::pow(10, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * p >= v * (1 - 1e-12)) return m * p;
  return 10 * p;
}

// The q-quantile (nearest rank) of the largest finite value of each row of `row_length` values.
double row_peak_percentile(const std::vector<double>& values, int64_t row_length, double q) {
  std::vector<double> peaks;
  for (size_t start = 0; start + row_length <= values.size(); start += row_length) {
    double peak = -INFINITY;
    for (int64_t j = 0; j < row_length; ++j)
      if (std::isfinite(values[start + j])) peak = std::max(peak, values[start + j]);
    if (peak > -INFINITY) peaks.push_back(peak);
  }
  if (peaks.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(peaks.size()))) - 1;
  std::nth_element(peaks.begin(), peaks.begin() + rank, peaks.end());
  return peaks[rank];
}

ValueRange find_range(const std::vector<double>& values, int64_t row_length,
                      const HeatmapOptions& o, const char* what) {
  ValueRange r;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) {
      r.non_finite = true;
      continue;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const bool given_lo = !std::isnan(o.vmin), given_hi = !std::isnan(o.vmax);
  if ((given_lo && !std::isfinite(o.vmin)) || (given_hi && !std::isfinite(o.vmax)))
    throw Error(fmt::format("{}: vmin/vmax must be finite, got [{}, {}]", what, o.vmin, o.vmax));
  r.vmin = given_lo ? o.vmin : 0;
  r.vmax = given_hi ? o.vmax : 1;
  if (lo <= hi) {  // some finite value
    if (!given_lo && lo < 0) r.vmin = lo, r.widened = true;
    if (!given_hi && hi > 1) r.vmax = hi, r.widened = true;
    // Long rows spread their weight thin: [0, 1] would paint everything dark. When 90% of the rows
    // peak at 0.5 or less, the top of the scale comes down to that 90th percentile of row maxima,
    // rounded up to 1, 2, 2.5 or 5 times a power of ten; the few brighter cells (a causal map's
    // first rows) are clamped and the colour bar's triangle says so.
    const double peak = row_peak_percentile(values, row_length, 0.9);
    if (!given_lo && !given_hi && !r.widened && peak > 0 && peak <= 0.5)
      r.vmax = round_up_nicely(peak), r.narrowed = true;
    if (!given_hi && given_lo && r.vmin >= r.vmax) r.vmax = std::max(hi, r.vmin + 1);
    if (!given_lo && given_hi && r.vmin >= r.vmax) r.vmin = std::min(lo, r.vmax - 1);
    r.below = lo < r.vmin;
    r.above = hi > r.vmax;
  }
  if (!(r.vmin < r.vmax))
    throw Error(fmt::format("{}: the colour range is empty: vmin {} must be below vmax {}", what,
                            r.vmin, r.vmax));
  return r;
}

}  // namespace

HeatmapLayout layout_heatmap(const std::vector<double>& values, int64_t heads, int64_t lq,
                             int64_t lk, bool grid, const HeatmapOptions& o, const char* what) {
  if (lq < 1 || lk < 1 || heads < 1)
    throw Error(
        fmt::format("{}: weights have no cells (heads {}, Lq {}, Lk {})", what, heads, lq, lk));
  if (lq > kMaxTokens || lk > kMaxTokens)
    throw Error(
        fmt::format("{}: Lq {} x Lk {} is too large to draw (at most {} per axis); slice it first",
                    what, lq, lk, kMaxTokens));
  if (!o.x_labels.empty() && static_cast<int64_t>(o.x_labels.size()) != lk)
    throw Error(fmt::format("{}: x_labels has {} entries but the weights have Lk = {} keys", what,
                            o.x_labels.size(), lk));
  if (!o.y_labels.empty() && static_cast<int64_t>(o.y_labels.size()) != lq)
    throw Error(fmt::format("{}: y_labels has {} entries but the weights have Lq = {} queries",
                            what, o.y_labels.size(), lq));
  if (!(o.cell_px >= 0 && o.cell_px <= 200))
    throw Error(
        fmt::format("{}: cell_px must be in [0, 200] (0 = automatic), got {}", what, o.cell_px));
  if (!(o.scale > 0 && o.scale <= 8))
    throw Error(fmt::format("{}: scale must be in (0, 8], got {}", what, o.scale));

  HeatmapLayout L;
  L.heads = heads;
  L.lq = lq;
  L.lk = lk;
  L.range = find_range(values, lk, o, what);

  // Cell size: big cells for a few tokens, one pixel per token around 512, fractions beyond.
  const double longest = static_cast<double>(std::max(lq, lk));
  const double target = grid ? 300 : 560;
  if (o.cell_px > 0) {
    L.cell = o.cell_px;
  } else {
    L.cell = std::clamp(std::floor(target / longest), 1.0, grid ? 28.0 : 40.0);
    if (longest > target) L.cell = target / longest;
  }
  L.x = make_labels(o.x_labels, lk, L.cell, /*may_turn=*/true);
  L.y = make_labels(o.y_labels, lq, L.cell, /*may_turn=*/false);

  // One panel: [panel title] / [axis title | y labels | ticks | map] / [ticks | x labels | axis
  // title].
  const double map_w = lk * L.cell, map_h = lq * L.cell;
  const double panel_title_h = grid ? kPanelTitleFont + 8 : 0;
  const double left = std::ceil(kAxisTitleFont + 6 + L.y.extent + kTickLength + 3);
  const double below = std::ceil(kTickLength + 3 + L.x.extent + 6 + kAxisTitleFont + 4);
  const double panel_w =
      std::ceil(left + std::max(map_w, text_width(o.x_axis, kAxisTitleFont)) + 18);
  const double panel_h = std::ceil(panel_title_h + map_h + below + 10);

  int64_t cols = 1, rows = 1;
  if (grid) {
    // Near-square grids; among those, the one with the fewest empty slots (8 heads: 4 x 2, not 3 x
    // 3).
    const int64_t c0 = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(heads))));
    cols = c0;
    for (int64_t c = c0; c <= c0 + 1 && c <= heads; ++c) {
      const int64_t r = (heads + c - 1) / c;
      if (r * c - heads < ((heads + cols - 1) / cols) * cols - heads) cols = c;
    }
    rows = (heads + cols - 1) / cols;
  }

  const double title_h = o.title.empty() ? 0 : kTitleFont + 14;
  const double top = kMargin + title_h;
  L.panels.resize(heads);
  for (int64_t h = 0; h < heads; ++h) {
    const double px = kMargin + (h % cols) * panel_w, py = top + (h / cols) * panel_h;
    L.panels[h].title = grid ? fmt::format("head {}", h) : "";
    L.panels[h].map_x = px + left;
    L.panels[h].map_y = py + panel_title_h;
  }

  // Colour bar to the right of the panels, level with the first map.
  L.bar_x = kMargin + cols * panel_w + 6;
  L.bar_y = top + panel_title_h + (L.range.above ? kTriangle + 2 : 0);
  L.bar_w = kBarWidth;
  L.bar_h = std::clamp(map_h, 140.0, 320.0);
  double column_w = kBarWidth + kTickLength + 4 + text_width("-0.000", 10) + 8;
  L.legend_y = L.bar_y + L.bar_h + (L.range.below ? kTriangle + 2 : 0) + 24;
  double legend_h = 0;
  if (L.range.non_finite) {
    column_w = std::max(column_w, kBarWidth + 6 + text_width("NaN / \u00b1inf", 10) + 8);
    legend_h += 18;
  }
  if (L.range.widened || L.range.below || L.range.above) {
    column_w = std::max(column_w, text_width("values outside [0, 1]", 10) + 8);
    legend_h += 18;
  }

  L.width = std::ceil(L.bar_x + column_w + kMargin);
  L.height = std::ceil(std::max(top + rows * panel_h, L.legend_y + legend_h) + kMargin - 10);
  L.title_x = kMargin + cols * panel_w / 2;
  L.title_y = kMargin + kTitleFont;
  if (L.title_x - text_width(o.title, kTitleFont, true) / 2 < kMargin) {
    L.title_x = kMargin + text_width(o.title, kTitleFont, true) / 2;
    L.width = std::max(L.width, std::ceil(2 * kMargin + text_width(o.title, kTitleFont, true)));
  }
  if (L.width * o.scale > kMaxSide || L.height * o.scale > kMaxSide)
    throw Error(
        fmt::format("{}: the picture would be {:.0f} x {:.0f} pixels; use fewer tokens, heads or a "
                    "smaller cell_px/scale",
                    what, L.width * o.scale, L.height * o.scale));
  return L;
}

namespace {

double normalise(double v, const ValueRange& r) {
  return (v - r.vmin) / (r.vmax - r.vmin);
}

Rgb cell_colour(double v, const ValueRange& r) {
  return std::isfinite(v) ? colormap(normalise(v, r)) : nan_colour();
}

// Cells of one head, values [lq, lk] row-major, at (x, y).
void draw_cells(Canvas& canvas, const double* values, const HeatmapLayout& L, double x, double y) {
  cairo_t* cr = canvas.cr();
  const bool whole_pixels = L.cell >= 1 && L.cell == std::floor(L.cell);
  const bool as_rects =
      whole_pixels && (canvas.format() == ImageFormat::png || L.lq * L.lk <= kSvgRectCells);
  if (as_rects) {
    // Whole-pixel cells on whole-pixel origins: no antialiasing, so neighbouring cells never bleed.
    cairo_save(cr);
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
    for (int64_t i = 0; i < L.lq; ++i)
      for (int64_t j = 0; j < L.lk; ++j)
        canvas.fill_rect(x + j * L.cell, y + i * L.cell, L.cell, L.cell,
                         cell_colour(values[i * L.lk + j], L.range));
    cairo_restore(cr);
    return;
  }
  // Many or fractional cells: one image, p x p pixels per cell, painted scaled to cell x cell.
  const int p = L.cell >= 1 ? static_cast<int>(std::floor(L.cell)) : 1;
  cairo_surface_t* img = cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(L.lk * p),
                                                    static_cast<int>(L.lq * p));
  cairo_surface_flush(img);
  unsigned char* data = cairo_image_surface_get_data(img);
  const int stride = cairo_image_surface_get_stride(img);
  for (int64_t i = 0; i < L.lq; ++i)
    for (int64_t j = 0; j < L.lk; ++j) {
      const Rgb c = cell_colour(values[i * L.lk + j], L.range);
      const uint32_t px = (uint32_t{c.r} << 16) | (uint32_t{c.g} << 8) | c.b;
      for (int a = 0; a < p; ++a)
        for (int b = 0; b < p; ++b)
          reinterpret_cast<uint32_t*>(data + (i * p + a) * stride)[j * p + b] = px;
    }
  cairo_surface_mark_dirty(img);
  cairo_save(cr);
  cairo_translate(cr, x, y);
  const double s = L.cell / p;
  cairo_scale(cr, s, s);
  cairo_set_source_surface(cr, img, 0, 0);
  cairo_pattern_set_filter(cairo_get_source(cr), s == 1 ? CAIRO_FILTER_NEAREST : CAIRO_FILTER_GOOD);
  cairo_rectangle(cr, 0, 0, L.lk * p, L.lq * p);
  cairo_fill(cr);
  cairo_restore(cr);
  cairo_surface_destroy(img);
}

void line(cairo_t* cr, double x0, double y0, double x1, double y1, Rgb c, double width) {
  cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0);
  cairo_set_line_width(cr, width);
  cairo_move_to(cr, x0, y0);
  cairo_line_to(cr, x1, y1);
  cairo_stroke(cr);
}

void draw_panel(Canvas& canvas, const double* values, const HeatmapLayout& L, const Panel& P,
                const HeatmapOptions& o) {
  cairo_t* cr = canvas.cr();
  const double map_w = L.lk * L.cell, map_h = L.lq * L.cell;
  if (!P.title.empty())
    canvas.text(P.map_x + map_w / 2, P.map_y - 7, P.title,
                {.size = kPanelTitleFont, .bold = true, .anchor = Anchor::middle});
  draw_cells(canvas, values, L, P.map_x, P.map_y);
  cairo_rectangle(cr, P.map_x - 0.5, P.map_y - 0.5, map_w + 1, map_h + 1);
  cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);

  // y labels: right-aligned left of the map, centred on their rows.
  for (int64_t i = 0; i < L.lq; i += L.y.step) {
    const double cy = P.map_y + (i + 0.5) * L.cell;
    line(cr, P.map_x - 1, cy, P.map_x - 1 - kTickLength, cy, kMutedInk, 1);
    canvas.text(P.map_x - kTickLength - 3, cy + 0.35 * L.y.font, L.y.text[i],
                {.size = L.y.font, .anchor = Anchor::end});
  }
  // x labels under the map: centred on their columns, or turned to read upwards and end at the
  // tick.
  const double xb = P.map_y + map_h + 1;
  for (int64_t j = 0; j < L.lk; j += L.x.step) {
    const double cx = P.map_x + (j + 0.5) * L.cell;
    line(cr, cx, xb, cx, xb + kTickLength, kMutedInk, 1);
    if (L.x.vertical)
      canvas.text(cx + 0.35 * L.x.font, xb + kTickLength + 3, L.x.text[j],
                  {.size = L.x.font, .anchor = Anchor::end, .vertical = true});
    else
      canvas.text(cx, xb + kTickLength + 2 + L.x.font, L.x.text[j],
                  {.size = L.x.font, .anchor = Anchor::middle});
  }
  // Axis titles.
  canvas.text(P.map_x + map_w / 2, xb + kTickLength + 3 + L.x.extent + 6 + kAxisTitleFont, o.x_axis,
              {.size = kAxisTitleFont, .anchor = Anchor::middle, .colour = kMutedInk});
  canvas.text(
      P.map_x - kTickLength - 3 - L.y.extent - 6, P.map_y + map_h / 2, o.y_axis,
      {.size = kAxisTitleFont, .anchor = Anchor::middle, .vertical = true, .colour = kMutedInk});
}

// Ticks at round values inside [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten, about 5 of
// them.
std::vector<double> nice_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double p = std::pow(10, std::floor(std::log10(raw)));
  double step = 10 * p;
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * p >= raw) {
      step = m * p;
      break;
    }
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; ++k) {
    const double t = k * step;
    ticks.push_back(std::abs(t) < 1e-12 * step ? 0.0 : t);
  }
  return ticks;
}

void draw_colour_bar(Canvas& canvas, const HeatmapLayout& L) {
  cairo_t* cr = canvas.cr();
  const ValueRange& r = L.range;
  // The map as a vertical gradient, vmax at the top.
  cairo_pattern_t* g = cairo_pattern_create_linear(0, L.bar_y + L.bar_h, 0, L.bar_y);
  constexpr int kStops = 32;
  for (int k = 0; k <= kStops; ++k) {
    const Rgb c = colormap(static_cast<double>(k) / kStops);
    cairo_pattern_add_color_stop_rgb(g, static_cast<double>(k) / kStops, c.r / 255.0, c.g / 255.0,
                                     c.b / 255.0);
  }
  cairo_rectangle(cr, L.bar_x, L.bar_y, L.bar_w, L.bar_h);
  cairo_set_source(cr, g);
  cairo_fill(cr);
  cairo_pattern_destroy(g);
  // Triangles: values beyond the range were clamped to the end colours.
  auto triangle = [&](double base_y, double tip_y, Rgb c) {
    cairo_move_to(cr, L.bar_x, base_y);
    cairo_line_to(cr, L.bar_x + L.bar_w, base_y);
    cairo_line_to(cr, L.bar_x + L.bar_w / 2, tip_y);
    cairo_close_path(cr);
    cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0);
    cairo_fill(cr);
  };
  if (r.above) triangle(L.bar_y, L.bar_y - kTriangle, colormap(1));
  if (r.below) triangle(L.bar_y + L.bar_h, L.bar_y + L.bar_h + kTriangle, colormap(0));
  cairo_rectangle(cr, L.bar_x - 0.5, L.bar_y - 0.5, L.bar_w + 1, L.bar_h + 1);
  cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (double t : nice_ticks(r.vmin, r.vmax)) {
    const double y = L.bar_y + L.bar_h * (1 - normalise(t, r));
    line(cr, L.bar_x + L.bar_w, y, L.bar_x + L.bar_w + kTickLength, y, kMutedInk, 1);
    canvas.text(L.bar_x + L.bar_w + kTickLength + 3, y + 3.5, fmt::format("{:g}", t), {.size = 10});
  }
  double y = L.legend_y;
  if (r.non_finite) {
    canvas.fill_rect(L.bar_x, y - 9, L.bar_w, 11, nan_colour());
    canvas.text(L.bar_x + L.bar_w + 6, y, "NaN / \u00b1inf", {.size = 10});
    y += 18;
  }
  if (r.widened || r.below || r.above)
    canvas.text(L.bar_x, y, r.widened ? "values outside [0, 1]" : "clamped to range",
                {.size = 10, .colour = kMutedInk});
}

std::vector<double> as_doubles(const Tensor& t) {
  return t.to_vector();
}

std::string render(const Tensor& weights, int64_t heads, int64_t lq, int64_t lk, bool grid,
                   const HeatmapOptions& o, ImageFormat format, const char* what) {
  const std::vector<double> values = as_doubles(weights);
  const HeatmapLayout L = layout_heatmap(values, heads, lq, lk, grid, o, what);
  Canvas canvas(format, L.width, L.height, format == ImageFormat::png ? o.scale : 1);
  if (!o.title.empty())
    canvas.text(L.title_x, L.title_y, o.title,
                {.size = kTitleFont, .bold = true, .anchor = Anchor::middle});
  for (int64_t h = 0; h < heads; ++h)
    draw_panel(canvas, values.data() + h * lq * lk, L, L.panels[h], o);
  draw_colour_bar(canvas, L);
  return canvas.finish();
}

}  // namespace
}  // namespace detail

ImageFormat format_from_path(const std::string& path, const char* what) {
  std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (ext == ".png") return ImageFormat::png;
  if (ext == ".svg") return ImageFormat::svg;
  throw Error(fmt::format(
      "{}: cannot tell the image format of '{}': the name must end in .png or .svg", what, path));
}

std::string render_heatmap(const Tensor& weights, const HeatmapOptions& options,
                           ImageFormat format) {
  constexpr const char* what = "attn::viz::render_heatmap";
  if (!weights.defined() || weights.dim() != 2)
    throw Error(fmt::format("{}: weights must be [Lq, Lk], got {}", what,
                            weights.defined() ? weights.shape_str() : "an undefined tensor"));
  return detail::render(weights, 1, weights.size(0), weights.size(1), false, options, format, what);
}

std::string render_head_grid(const Tensor& weights, const HeatmapOptions& options,
                             ImageFormat format) {
  constexpr const char* what = "attn::viz::render_head_grid";
  if (!weights.defined() || weights.dim() != 3)
    throw Error(fmt::format("{}: weights must be [H, Lq, Lk], got {}", what,
                            weights.defined() ? weights.shape_str() : "an undefined tensor"));
  if (weights.size(0) > 256)
    throw Error(fmt::format("{}: {} heads are too many for one picture (at most 256), weights {}",
                            what, weights.size(0), weights.shape_str()));
  return detail::render(weights, weights.size(0), weights.size(1), weights.size(2), true, options,
                        format, what);
}

void write_heatmap(const std::string& path, const Tensor& weights, const HeatmapOptions& options) {
  const ImageFormat f = format_from_path(path, "attn::viz::write_heatmap");
  write_file_atomically(path, render_heatmap(weights, options, f), "attn::viz::write_heatmap");
}

void write_head_grid(const std::string& path, const Tensor& weights,
                     const HeatmapOptions& options) {
  const ImageFormat f = format_from_path(path, "attn::viz::write_head_grid");
  write_file_atomically(path, render_head_grid(weights, options, f), "attn::viz::write_head_grid");
}

}  // namespace attn::viz
