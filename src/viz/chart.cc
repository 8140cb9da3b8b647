#include "viz/chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "viz/canvas.h"

namespace attn::viz::detail {
namespace {

constexpr double kWidth = 540, kHeight = 300;
constexpr double kLeft = 62, kRight = 18, kTop = 40, kBottom = 42;
constexpr size_t kMaxPoints =
    1500;  // longer curves are thinned to every k-th point (the last one kept)

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> ticks;  // in data units
};

double nice_number(double raw) {
  const double p = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

// A linear axis from lo to hi widened to round ticks.
Axis linear_axis(double lo, double hi) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  Axis a;
  const double step = nice_number((hi - lo) / 5);
  a.lo = std::floor(lo / step + 1e-9) * step;
  a.hi = std::ceil(hi / step - 1e-9) * step;
  for (double k = std::round(a.lo / step); k * step <= a.hi + step * 1e-9; ++k)
    a.ticks.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
  return a;
}

// A log axis between whole decades, ticks at 10^k (and 2, 5 times when there are few decades).
Axis log_axis(double lo, double hi) {
  Axis a;
  a.log = true;
  const double d0 = std::floor(std::log10(lo)), d1 = std::ceil(std::log10(hi));
  a.lo = std::pow(10, d0);
  a.hi = std::pow(10, std::max(d1, d0 + 1));
  const int decades = static_cast<int>(std::log10(a.hi / a.lo) + 0.5);
  const int every = std::max(1, decades / 6);
  for (int d = 0; d <= decades; d += every) {
    const double base = a.lo * std::pow(10, d);
    a.ticks.push_back(base);
    if (decades <= 3 && d < decades)
      for (double m : {2.0, 5.0}) a.ticks.push_back(base * m);
  }
  return a;
}

double to_unit(const Axis& a, double v) {
  return a.log ? (std::log10(v) - std::log10(a.lo)) / (std::log10(a.hi) - std::log10(a.lo))
               : (v - a.lo) / (a.hi - a.lo);
}

std::string tick_text(double v) {
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-3)) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", v);
}

}  // namespace

Rgb line_colour(size_t k) {
  static constexpr Rgb kPalette[] = {{59, 111, 182}, {224, 115, 31}, {46, 158, 91},
                                     {194, 59, 78},  {125, 90, 181}, {140, 109, 63},
                                     {212, 95, 168}, {95, 107, 115}};
  return kPalette[k % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::string line_chart_svg(const std::string& title, const std::map<std::string, Curve>& lines,
                           bool allow_log) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const auto& [name, curve] : lines)
    for (const auto& [x, y] : curve) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  std::string svg = fmt::format(
      "<svg class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" "
      "aria-label=\"{2}\">\n<rect width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n"
      "<text x=\"{3}\" y=\"22\" class=\"chart-title\">{2}</text>\n",
      kWidth, kHeight, xml_escape(title), kLeft);
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  if (!(x_lo <= x_hi)) {
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"chart-empty\">no "
        "data</text>\n</svg>\n",
        kLeft + pw / 2, kTop + ph / 2);
    return svg;
  }
  const Axis xa = linear_axis(x_lo, x_hi);
  const bool use_log = allow_log && y_lo > 0 && y_hi / y_lo > 100;
  const Axis ya = use_log ? log_axis(y_lo, y_hi)
                          : (y_lo >= 0 && y_hi <= 1 && y_hi > 0.2 ? linear_axis(0, 1)
                                                                  : linear_axis(y_lo, y_hi));
  auto px = [&](double x) { return kLeft + pw * to_unit(xa, x); };
  auto py = [&](double y) { return kTop + ph * (1 - to_unit(ya, y)); };

  // Grid and ticks.
  svg += "<g class=\"grid\">\n";
  for (double t : ya.ticks)
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", kLeft,
                       py(t), kLeft + pw, py(t));
  for (double t : xa.ticks)
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", px(t),
                       kTop, px(t), kTop + ph);
  svg += "</g>\n<g class=\"ticks\">\n";
  for (double t : ya.ticks)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", kLeft - 6,
                       py(t) + 4, tick_text(t));
  for (double t : xa.ticks)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(t),
                       kTop + ph + 16, tick_text(t));
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" class=\"axis-title\">step{}</text>\n",
      kLeft + pw / 2, kHeight - 6, use_log ? " \u00b7 y on a log scale" : "");
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#9a9a9a\"/>\n",
      kLeft, kTop, pw, ph);
  svg += "</g>\n";

  // Lines, then the legend (top right, inside the title row).
  size_t k = 0;
  double legend_x = kWidth - kRight;
  std::string legend;
  for (const auto& [name, curve] : lines) {
    const Rgb c = line_colour(k++);
    const size_t stride =
        curve.size() > kMaxPoints ? (curve.size() + kMaxPoints - 1) / kMaxPoints : 1;
    std::string points;
    for (size_t i = 0; i < curve.size(); ++i) {
      if (i % stride != 0 && i + 1 != curve.size()) continue;
      const auto [x, y] = curve[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (use_log && y <= 0)) continue;
      points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    svg += fmt::format(
        "<polyline class=\"series\" data-name=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"2\" "
        "stroke-linejoin=\"round\" points=\"{}\"/>\n",
        xml_escape(name), to_hex(c), points);
    if (lines.size() > 1) {
      const double w = text_width(name, 11) + 26;
      legend_x -= w;
      legend += fmt::format(
          "<line x1=\"{0:.1f}\" y1=\"18\" x2=\"{1:.1f}\" y2=\"18\" stroke=\"{2}\" "
          "stroke-width=\"3\"/>"
          "<text x=\"{3:.1f}\" y=\"22\" class=\"legend\">{4}</text>\n",
          legend_x, legend_x + 14, to_hex(c), legend_x + 18, xml_escape(name));
    }
  }
  svg += legend + "</svg>\n";
  return svg;
}

}  // namespace attn::viz::detail
