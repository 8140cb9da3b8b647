// attn._core.viz: heatmaps of attention weights (PNG / SVG through Cairo) and the HTML report
// (include/attn/viz.h), for the pure-Python attn.viz.
#include <fmt/format.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "arrays.h"
#include "attn/viz.h"
#include "bindings.h"

namespace attn::python {

namespace {

using StringList = std::vector<std::string>;

viz::HeatmapOptions heatmap_options(const StringList& x_labels, const StringList& y_labels,
                                    const std::string& title, const std::string& x_axis,
                                    const std::string& y_axis, std::optional<double> vmin,
                                    std::optional<double> vmax, double cell_px, double scale) {
  viz::HeatmapOptions o;
  o.x_labels = x_labels;
  o.y_labels = y_labels;
  o.title = title;
  o.x_axis = x_axis;
  o.y_axis = y_axis;
  o.vmin = vmin.value_or(std::numeric_limits<double>::quiet_NaN());
  o.vmax = vmax.value_or(std::numeric_limits<double>::quiet_NaN());
  o.cell_px = cell_px;
  o.scale = scale;
  return o;
}

// [Lq, Lk] -> one heatmap, [H, Lq, Lk] -> a grid of heads; anything else is a ValueError.
Tensor weights_arg(ArrayScope& scope, nb::handle weights) {
  Tensor w = scope.import(weights, "weights");
  if (w.dim() != 2 && w.dim() != 3) {
    throw nb::value_error(fmt::format("{}: weights must be [Lq, Lk] or [H, Lq, Lk], got shape {}",
                                      scope.fn(), w.shape_str())
                              .c_str());
  }
  if (!is_floating(w.dtype())) w = w.to(DType::f64);
  return w.contiguous();
}

}  // namespace

void bind_viz(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("viz", "attn::viz (use attn.viz, which wraps it).");

  m.def(
      "render_heatmap",
      [](nb::handle weights, const StringList& x_labels, const StringList& y_labels,
         const std::string& title, const std::string& x_axis, const std::string& y_axis,
         std::optional<double> vmin, std::optional<double> vmax, double cell_px, double scale,
         const std::string& format) {
        ArrayScope scope("attn.viz.heatmap");
        const Tensor w = weights_arg(scope, weights);
        const viz::ImageFormat f = viz::format_from_path("x." + format, "attn.viz.heatmap format");
        const viz::HeatmapOptions o =
            heatmap_options(x_labels, y_labels, title, x_axis, y_axis, vmin, vmax, cell_px, scale);
        std::string bytes;
        {
          nb::gil_scoped_release release;
          bytes = w.dim() == 2 ? viz::render_heatmap(w, o, f) : viz::render_head_grid(w, o, f);
        }
        return nb::bytes(bytes.data(), bytes.size());
      },
      nb::arg("weights"), nb::arg("x_labels"), nb::arg("y_labels"), nb::arg("title"),
      nb::arg("x_axis"), nb::arg("y_axis"), nb::arg("vmin").none(), nb::arg("vmax").none(),
      nb::arg("cell_px"), nb::arg("scale"), nb::arg("format"));

  m.def(
      "write_heatmap",
      [](const std::string& path, nb::handle weights, const StringList& x_labels,
         const StringList& y_labels, const std::string& title, const std::string& x_axis,
         const std::string& y_axis, std::optional<double> vmin, std::optional<double> vmax,
         double cell_px, double scale) {
        ArrayScope scope("attn.viz.heatmap");
        const Tensor w = weights_arg(scope, weights);
        const viz::HeatmapOptions o =
            heatmap_options(x_labels, y_labels, title, x_axis, y_axis, vmin, vmax, cell_px, scale);
        nb::gil_scoped_release release;
        if (w.dim() == 2) {
          viz::write_heatmap(path, w, o);
        } else {
          viz::write_head_grid(path, w, o);
        }
      },
      nb::arg("path"), nb::arg("weights"), nb::arg("x_labels"), nb::arg("y_labels"),
      nb::arg("title"), nb::arg("x_axis"), nb::arg("y_axis"), nb::arg("vmin").none(),
      nb::arg("vmax").none(), nb::arg("cell_px"), nb::arg("scale"));

  m.def(
      "mean_row_entropy",
      [](nb::handle weights) {
        ArrayScope scope("attn.viz.mean_row_entropy");
        Tensor w = scope.import(weights, "weights");
        if (w.dim() != 3) {
          throw nb::value_error(
              fmt::format("attn.viz.mean_row_entropy: weights must be [H, Lq, Lk], got {}",
                          w.shape_str())
                  .c_str());
        }
        return viz::mean_row_entropy(w);
      },
      nb::arg("weights"));

  // layers: (name, weights [H, Lq, Lk], q_tokens, k_tokens); entropy is computed from them.
  m.def(
      "render_report",
      [](const std::string& title, const std::vector<std::pair<std::string, std::string>>& summary,
         const std::map<std::string, viz::Curve>& series, nb::list layers,
         double one_hot_below_nats, double uniform_above_fraction) {
        ArrayScope scope("attn.viz.report");
        viz::ReportData d;
        d.title = title;
        d.summary = summary;
        d.series = series;
        d.one_hot_below_nats = one_hot_below_nats;
        d.uniform_above_fraction = uniform_above_fraction;
        for (nb::handle item : layers) {
          nb::tuple t = nb::cast<nb::tuple>(item);
          if (t.size() != 4)
            throw nb::value_error(
                "attn.viz.report: layers are (name, weights, q_tokens, k_tokens)");
          viz::LayerAttention la;
          la.name = nb::cast<std::string>(t[0]);
          la.weights = scope.import(t[1], "layer weights");
          if (la.weights.dim() != 3) {
            throw nb::value_error(
                fmt::format("attn.viz.report: layer '{}' weights must be [H, Lq, Lk], got {}",
                            la.name, la.weights.shape_str())
                    .c_str());
          }
          la.weights = la.weights.contiguous();
          la.q_tokens = nb::cast<StringList>(t[2]);
          la.k_tokens = nb::cast<StringList>(t[3]);
          viz::HeadEntropy e;
          e.layer = la.name;
          e.nats = viz::mean_row_entropy(la.weights);
          e.max_nats =
              la.weights.size(2) > 0 ? std::log(static_cast<double>(la.weights.size(2))) : 0.0;
          d.entropy.push_back(std::move(e));
          d.layers.push_back(std::move(la));
        }
        std::string html;
        {
          nb::gil_scoped_release release;
          html = viz::render_report(d);
        }
        return html;
      },
      nb::arg("title"), nb::arg("summary"), nb::arg("series"), nb::arg("layers"),
      nb::arg("one_hot_below_nats"), nb::arg("uniform_above_fraction"));

  m.def(
      "write_file_atomically",
      [](const std::string& path, nb::bytes data) {
        const std::string bytes(static_cast<const char*>(data.data()), data.size());
        nb::gil_scoped_release release;
        viz::write_file_atomically(path, bytes, "attn.viz");
      },
      nb::arg("path"), nb::arg("data"));
}

}  // namespace attn::python
