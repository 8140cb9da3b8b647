// Line charts as inline SVG (no xmlns, no scripts): training curves for the HTML report.
#pragma once
#include <map>
#include <string>

#include "attn/viz.h"

namespace attn::viz::detail {

// One chart: every entry of `lines` is a polyline (name -> (step, value) points) in its own colour,
// with a legend when there is more than one. With `allow_log` the y axis turns logarithmic when
// every value is positive and they span more than two decades. Non-finite points are left out.
std::string line_chart_svg(const std::string& title, const std::map<std::string, Curve>& lines,
                           bool allow_log);

// The colour of the k-th line of a chart.
Rgb line_colour(size_t k);

}  // namespace attn::viz::detail
