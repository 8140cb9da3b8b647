#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/viz.h"
#include "viz/heatmap_layout.h"
#include "viz/viz_test_util.h"

namespace attn::viz {
namespace {

using testing::DecodedPng;

// [lq, lk] zeros with a single 1 at (hi, hj).
Tensor one_hot_cell(int64_t lq, int64_t lk, int64_t hi, int64_t hj) {
  Tensor t = Tensor::zeros({lq, lk}, DType::f32);
  t.set({hi, hj}, 1.0);
  return t;
}

detail::HeatmapLayout layout_of(const Tensor& w, bool grid, const HeatmapOptions& o) {
  const int64_t heads = grid ? w.size(0) : 1;
  return detail::layout_heatmap(w.to_vector(), heads, w.size(-2), w.size(-1), grid, o, "test");
}

// Pixel centre of cell (i, j) of panel h.
std::pair<int, int> cell_centre(const detail::HeatmapLayout& L, int64_t h, int64_t i, int64_t j,
                                double scale) {
  return {static_cast<int>((L.panels[h].map_x + (j + 0.5) * L.cell) * scale),
          static_cast<int>((L.panels[h].map_y + (i + 0.5) * L.cell) * scale)};
}

std::string temp_dir() {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("attn_viz_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

bool svg_is_well_formed(const std::string& svg) {
  const std::string path = temp_dir() + "/check.svg";
  std::ofstream(path) << svg;
  const std::string cmd =
      "python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' " + path +
      " 2>/dev/null";
  return std::system(cmd.c_str()) == 0;
}

TEST(Heatmap, PngDecodesWithTheHotCellWhereItBelongs) {
  for (double scale : {1.0, 2.0}) {
    const Tensor w = one_hot_cell(6, 9, 2, 5);
    HeatmapOptions o;
    o.title = "one hot cell";
    o.scale = scale;
    const std::string png = render_heatmap(w, o, ImageFormat::png);
    DecodedPng img(png);
    ASSERT_TRUE(img.ok());
    const auto L = layout_of(w, false, o);
    EXPECT_EQ(img.width(), static_cast<int>(std::ceil(L.width * scale)));
    EXPECT_EQ(img.height(), static_cast<int>(std::ceil(L.height * scale)));
    const auto [hx, hy] = cell_centre(L, 0, 2, 5, scale);
    EXPECT_EQ(to_hex(img.at(hx, hy)), to_hex(colormap(1))) << "scale " << scale;
    const auto [cx, cy] = cell_centre(L, 0, 2, 4, scale);
    EXPECT_EQ(to_hex(img.at(cx, cy)), to_hex(colormap(0)));
    const auto [dx, dy] = cell_centre(L, 0, 3, 5, scale);
    EXPECT_EQ(to_hex(img.at(dx, dy)), to_hex(colormap(0)));
    // Exactly one cell is hot: cell area in pixels (plus nothing else of that colour but the colour
    // bar).
    const int64_t cell_px =
        static_cast<int64_t>(L.cell * scale) * static_cast<int64_t>(L.cell * scale);
    EXPECT_GE(img.count(colormap(1)), cell_px);
    EXPECT_GT(img.count({255, 255, 255}), img.width() * img.height() / 10);  // background
    EXPECT_GT(img.count(colormap(0)), 40 * cell_px);                         // the cold cells
  }
}

TEST(Heatmap, MiddleValuesGetMiddleColours) {
  Tensor w = Tensor::from_vector({1, 3}, {0.0, 0.5, 1.0}, DType::f64);
  const std::string png = render_heatmap(w, {}, ImageFormat::png);
  DecodedPng img(png);
  ASSERT_TRUE(img.ok());
  const auto L = layout_of(w, false, {});
  for (int j = 0; j < 3; ++j) {
    const auto [x, y] = cell_centre(L, 0, 0, j, 1);
    EXPECT_EQ(to_hex(img.at(x, y)), to_hex(colormap(j / 2.0))) << j;
  }
}

TEST(HeadGrid, EveryHeadInItsPanel) {
  Tensor w = Tensor::zeros({5, 4, 7}, DType::f32);
  for (int64_t h = 0; h < 5; ++h) w.set({h, h % 4, (h + 2) % 7}, 1.0);
  HeatmapOptions o;
  o.title = "five heads";
  const std::string png = render_head_grid(w, o, ImageFormat::png);
  DecodedPng img(png);
  ASSERT_TRUE(img.ok());
  const auto L = layout_of(w, true, o);
  ASSERT_EQ(L.panels.size(), 5u);
  EXPECT_EQ(L.panels[0].title, "head 0");
  EXPECT_EQ(L.panels[4].title, "head 4");
  // 5 heads: 3 columns, 2 rows; panels do not overlap.
  EXPECT_LT(L.panels[0].map_y, L.panels[3].map_y);
  EXPECT_LT(L.panels[0].map_x, L.panels[1].map_x);
  for (int64_t h = 0; h < 5; ++h) {
    const auto [x, y] = cell_centre(L, h, h % 4, (h + 2) % 7, 1);
    EXPECT_EQ(to_hex(img.at(x, y)), to_hex(colormap(1))) << "head " << h;
    const auto [cx, cy] = cell_centre(L, h, (h + 1) % 4, (h + 2) % 7, 1);
    EXPECT_EQ(to_hex(img.at(cx, cy)), to_hex(colormap(0))) << "head " << h;
  }
}

TEST(HeadGrid, EightHeadsMakeFourByTwo) {
  const auto L = layout_of(Tensor::zeros({8, 3, 3}, DType::f32), true, {});
  EXPECT_EQ(L.panels[3].map_y, L.panels[0].map_y);
  EXPECT_GT(L.panels[4].map_y, L.panels[0].map_y);
}

TEST(Heatmap, NaNAndInfinityInTheirOwnColourWithALegend) {
  Tensor w = Tensor::full({4, 4}, 0.25, DType::f64);
  w.set({1, 2}, std::nan(""));
  w.set({3, 0}, INFINITY);
  const std::string png = render_heatmap(w, {}, ImageFormat::png);
  DecodedPng img(png);
  ASSERT_TRUE(img.ok());
  const auto L = layout_of(w, false, {});
  EXPECT_TRUE(L.range.non_finite);
  for (auto [i, j] : {std::pair{1, 2}, std::pair{3, 0}}) {
    const auto [x, y] = cell_centre(L, 0, i, j, 1);
    EXPECT_EQ(to_hex(img.at(x, y)), to_hex(nan_colour()));
  }
  // Two cells plus the legend swatch.
  const int64_t cell_px = static_cast<int64_t>(L.cell) * static_cast<int64_t>(L.cell);
  EXPECT_GT(img.count(nan_colour()), 2 * cell_px);
  const std::string svg = render_heatmap(w, {}, ImageFormat::svg);
  EXPECT_NE(svg.find("NaN / \u00b1inf"), std::string::npos);
  // Without NaN there is no NaN legend.
  EXPECT_EQ(
      render_heatmap(Tensor::full({4, 4}, 0.25, DType::f64), {}, ImageFormat::svg).find("NaN"),
      std::string::npos);
}

TEST(Heatmap, RangeWidensToTheDataAndSaysSo) {
  Tensor w = Tensor::from_vector({2, 2}, {-0.5, 0.0, 1.0, 2.0}, DType::f64);
  auto L = layout_of(w, false, {});
  EXPECT_TRUE(L.range.widened);
  EXPECT_DOUBLE_EQ(L.range.vmin, -0.5);
  EXPECT_DOUBLE_EQ(L.range.vmax, 2.0);
  EXPECT_NE(render_heatmap(w, {}, ImageFormat::svg).find("values outside [0, 1]"),
            std::string::npos);
  // An explicit range clamps and marks the overflow on the colour bar.
  HeatmapOptions o;
  o.vmin = 0;
  o.vmax = 1;
  L = layout_of(w, false, o);
  EXPECT_FALSE(L.range.widened);
  EXPECT_TRUE(L.range.below);
  EXPECT_TRUE(L.range.above);
  DecodedPng img(render_heatmap(w, o, ImageFormat::png));
  ASSERT_TRUE(img.ok());
  const auto [x, y] = cell_centre(L, 0, 1, 1, 1);
  EXPECT_EQ(to_hex(img.at(x, y)), to_hex(colormap(1)));
  // Attention weights in [0, 1] keep the range [0, 1] ...
  Tensor sharp = Tensor::full({2, 2}, 0.3, DType::f32);
  sharp.set({0, 0}, 0.7);
  L = layout_of(sharp, false, {});
  EXPECT_FALSE(L.range.widened);
  EXPECT_FALSE(L.range.narrowed);
  EXPECT_EQ(L.range.vmin, 0);
  EXPECT_EQ(L.range.vmax, 1);
  // ... unless every weight is small (long rows): then the top comes down to a round number above
  // them.
  Tensor thin = Tensor::full({2, 2}, 0.01, DType::f32);
  thin.set({1, 0}, 0.17);
  L = layout_of(thin, false, {});
  EXPECT_TRUE(L.range.narrowed);
  EXPECT_EQ(L.range.vmin, 0);
  EXPECT_DOUBLE_EQ(L.range.vmax, 0.2);
  DecodedPng thin_img(render_heatmap(thin, {}, ImageFormat::png));
  ASSERT_TRUE(thin_img.ok());
  const auto [tx, ty] = cell_centre(L, 0, 1, 0, 1);
  EXPECT_EQ(to_hex(thin_img.at(tx, ty)), to_hex(colormap(0.17 / 0.2)));
  // An explicit range is kept as given.
  o = {};
  o.vmax = 1;
  EXPECT_FALSE(layout_of(thin, false, o).range.narrowed);
  EXPECT_EQ(layout_of(thin, false, o).range.vmax, 1);
}

TEST(Heatmap, SvgIsWellFormedAndCarriesTheLabels) {
  HeatmapOptions o;
  o.title = "reverse: \"a & b\"";
  o.x_labels = {"<bos>", "the", "cat", "sat"};
  o.y_labels = {"tac", "eht", "<eos>"};
  const std::string svg = render_heatmap(one_hot_cell(3, 4, 0, 2), o, ImageFormat::svg);
  EXPECT_TRUE(svg_is_well_formed(svg));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  for (const char* label :
       {"&lt;bos&gt;", ">the<", ">cat<", ">sat<", ">tac<", ">eht<", "&lt;eos&gt;", "key", "query"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_NE(svg.find("reverse: &quot;a &amp; b&quot;"), std::string::npos);
  // Big inputs embed the cells as one image and stay small and well-formed.
  Tensor big = Tensor::full({300, 300}, 1.0 / 300, DType::f32);
  const std::string big_svg = render_heatmap(big, {}, ImageFormat::svg);
  EXPECT_TRUE(svg_is_well_formed(big_svg));
  EXPECT_LT(big_svg.size(), 2u << 20);
}

TEST(Heatmap, SizesFromOneTo512Tokens) {
  for (int64_t n : {1, 2, 7, 33, 100, 257, 512, 1000}) {
    Tensor w = Tensor::zeros({n, n}, DType::f32);
    for (int64_t i = 0; i < n; ++i) w.set({i, n - 1 - i}, 1.0);  // anti-diagonal
    const auto L = layout_of(w, false, {});
    EXPECT_GT(L.cell, 0);
    EXPECT_LE(L.cell * n, 600) << n;
    EXPECT_GE(L.cell * n, std::min<double>(n, 200)) << n;  // never a postage stamp
    EXPECT_LT(L.width, 1000) << n;
    EXPECT_LT(L.height, 1000) << n;
    // Labels: all of them for a few tokens, thinned so they never overlap.
    if (n <= 16) {
      EXPECT_EQ(L.y.step, 1) << n;
    }
    EXPECT_GE(L.y.step * L.cell, L.y.font) << n;
    if (L.x.vertical) {
      EXPECT_GE(L.x.step * L.cell, L.x.font) << n;
    }
    DecodedPng img(render_heatmap(w, {}, ImageFormat::png));
    ASSERT_TRUE(img.ok()) << n;
    if (L.cell >= 1) {
      const auto [x, y] = cell_centre(L, 0, 0, n - 1, 1);
      EXPECT_EQ(to_hex(img.at(x, y)), to_hex(colormap(1))) << n;
    }
  }
}

TEST(Heatmap, LongLabelsTurnAndAreShortened) {
  HeatmapOptions o;
  o.x_labels = {"a", "supercalifragilisticexpialidocious", "c"};
  const auto L = layout_of(Tensor::zeros({2, 3}, DType::f32), false, o);
  EXPECT_TRUE(L.x.vertical);
  EXPECT_EQ(L.x.text[1], "supercalifragi\u2026");
  HeatmapOptions digits;
  const auto D = layout_of(Tensor::zeros({5, 5}, DType::f32), false, digits);
  EXPECT_FALSE(D.x.vertical);  // "0".."4" fit in 40-pixel cells
  EXPECT_EQ(D.x.text[4], "4");
}

TEST(Heatmap, BadInputIsRefusedWithANamedError) {
  auto expect_error = [](auto&& fn, const std::string& prefix, const std::string& mentions) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected " << prefix;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
    }
  };
  const Tensor w3 = Tensor::zeros({2, 3, 4}, DType::f32);
  const Tensor w2 = Tensor::zeros({3, 4}, DType::f32);
  expect_error([&] { render_heatmap(w3, {}, ImageFormat::png); }, "attn::viz::render_heatmap",
               "[2, 3, 4]");
  expect_error([&] { render_heatmap(Tensor(), {}, ImageFormat::png); }, "attn::viz::render_heatmap",
               "undefined");
  expect_error([&] { render_head_grid(w2, {}, ImageFormat::png); }, "attn::viz::render_head_grid",
               "[3, 4]");
  expect_error(
      [&] {
        render_heatmap(Tensor::zeros({0, 4}, DType::f32), {}, ImageFormat::png);
      },
      "attn::viz::render_heatmap", "no cells");
  HeatmapOptions o;
  o.x_labels = {"a", "b"};
  expect_error([&] { render_heatmap(w2, o, ImageFormat::svg); }, "attn::viz::render_heatmap",
               "x_labels has 2");
  o = {};
  o.y_labels = {"a"};
  expect_error([&] { render_head_grid(w3, o, ImageFormat::svg); }, "attn::viz::render_head_grid",
               "y_labels has 1");
  o = {};
  o.vmin = 1;
  o.vmax = 0.5;
  expect_error([&] { render_heatmap(w2, o, ImageFormat::png); }, "attn::viz::render_heatmap",
               "vmin");
  o = {};
  o.cell_px = 200;
  expect_error(
      [&] {
        render_heatmap(Tensor::zeros({200, 200}, DType::f32), o, ImageFormat::png);
      },
      "attn::viz::render_heatmap", "pixels");
  expect_error([&] { write_heatmap("x.jpg", w2, {}); }, "attn::viz::write_heatmap", ".png or .svg");
}

TEST(Heatmap, FilesAppearWholeOrNotAtAll) {
  const std::string dir = temp_dir();
  const std::string good = dir + "/map.PNG", grid = dir + "/grid.svg";
  write_heatmap(good, one_hot_cell(3, 3, 1, 1), {});
  write_head_grid(grid, Tensor::zeros({2, 3, 3}, DType::f32), {});
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(DecodedPng(bytes).ok());
  EXPECT_TRUE(std::filesystem::exists(grid));
  // A failed render leaves nothing behind, not even the temporary file.
  HeatmapOptions bad;
  bad.x_labels = {"only one"};
  const std::string failed = dir + "/failed.png";
  EXPECT_THROW(write_heatmap(failed, one_hot_cell(3, 3, 1, 1), bad), Error);
  EXPECT_FALSE(std::filesystem::exists(failed));
  EXPECT_THROW(write_heatmap(dir + "/no/such/folder/x.png", one_hot_cell(3, 3, 1, 1), {}), Error);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    files += e.path().filename() != "check.svg";
  EXPECT_EQ(files, 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attn::viz
