// Where everything of a heatmap picture goes, in user units (CSS pixels; PNG pixels are these times
// HeatmapOptions::scale). Computed once, then drawn on either surface; tests use it to find cells.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/viz.h"

namespace attn::viz::detail {

// The labels along one axis: every `step`-th token is written (thinned when cells are too small for
// text).
struct AxisLabels {
  std::vector<std::string> text;  // all Lq or Lk labels, truncated for display
  int64_t step = 1;
  double font = 12;
  bool vertical = false;  // x labels turn by -90 degrees when they are wider than their cells
  double extent = 0;      // space the written labels need away from the map
};

struct Panel {
  std::string title;            // "head h" in a grid; empty for a single map
  double map_x = 0, map_y = 0;  // top-left corner of cell (0, 0)
};

struct ValueRange {
  double vmin = 0, vmax = 1;
  bool widened = false;     // automatic range moved beyond [0, 1] to cover the data
  bool narrowed = false;    // automatic range [0, m]: every value is at most 0.5 (long rows)
  bool below = false;       // some finite value < vmin (explicit range)
  bool above = false;       // some finite value > vmax
  bool non_finite = false;  // some NaN or +-inf
};

struct HeatmapLayout {
  double width = 0, height = 0;
  int64_t heads = 1, lq = 0, lk = 0;
  double cell = 0;  // side of one cell
  std::vector<Panel> panels;
  AxisLabels x, y;
  ValueRange range;
  double title_x = 0, title_y = 0;
  double bar_x = 0, bar_y = 0, bar_w = 0, bar_h = 0;
  double legend_y = 0;  // first legend line (baseline) under the colour bar
};

// values: row-major [heads, lq, lk]. `grid` gives each panel a "head h" title. Throws attn::Error
// naming `what` for bad options (labels of the wrong length, an empty or inverted range, a picture
// too large).
HeatmapLayout layout_heatmap(const std::vector<double>& values, int64_t heads, int64_t lq,
                             int64_t lk, bool grid, const HeatmapOptions& options,
                             const char* what);

}  // namespace attn::viz::detail
