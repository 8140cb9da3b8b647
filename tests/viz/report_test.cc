#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/viz.h"
#include "viz/viz_test_util.h"

namespace attn::viz {
namespace {

using testing::DecodedPng;

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

std::string decode_base64(const std::string& s) {
  static const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    acc = (acc << 6) | static_cast<uint32_t>(alphabet.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

struct Image {
  int width = 0;
  std::string base64;
};

// Every <img width="W" src="data:image/png;base64,..."> (std::regex recurses per character: too
// deep for base64 of this size).
std::vector<Image> images_of(const std::string& html) {
  std::vector<Image> out;
  const std::string head = "<img width=\"", data = "\" src=\"data:image/png;base64,";
  for (size_t p = html.find(head); p != std::string::npos; p = html.find(head, p + 1)) {
    const size_t w0 = p + head.size(), w1 = html.find(data, w0);
    if (w1 == std::string::npos) break;
    const size_t b0 = w1 + data.size(), b1 = html.find('"', b0);
    out.push_back({std::stoi(html.substr(w0, w1 - w0)), html.substr(b0, b1 - b0)});
  }
  return out;
}

// The html with every base64 payload of a data: URI removed ("data:" stays).
std::string strip_data_uris(const std::string& html) {
  std::string out;
  const std::string tag = "data:image/png;base64,";
  size_t p = 0;
  for (size_t q = html.find(tag); q != std::string::npos; q = html.find(tag, p)) {
    out += html.substr(p, q - p) + "data:";
    p = html.find('"', q);
  }
  return out + html.substr(p);
}

// The table row that starts with `start` (empty when there is none).
std::string row_of(const std::string& html, const std::string& start) {
  const size_t p = html.find(start);
  return p == std::string::npos ? "" : html.substr(p, html.find("</tr>", p) - p);
}

// Two layers of a reversal model: head 0 an anti-diagonal (one-hot), head 1 uniform.
ReportData sample_report() {
  ReportData d;
  d.title = "reverse <demo>";
  d.summary = {{"task", "reverse"}, {"held-out accuracy", "0.997"}, {"steps", "600"}};
  for (int s = 0; s <= 600; s += 10) {
    d.series["loss/train"].emplace_back(s, 2.5 * std::exp(-s / 80.0) + 0.01);
    d.series["loss/held-out"].emplace_back(s, 2.6 * std::exp(-s / 85.0) + 0.02);
    d.series["accuracy/held-out"].emplace_back(s, 1 - std::exp(-s / 100.0));
    d.series["grad_norm"].emplace_back(s, 5 * std::exp(-s / 150.0) + 0.05);
    d.series["learning rate"].emplace_back(s, 1e-3);
  }
  const std::vector<std::string> tokens = {"3", "1", "4", "1", "5", "9"};
  for (int l = 0; l < 2; ++l) {
    Tensor w = Tensor::zeros({2, 6, 6}, DType::f32);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 6; ++j) {
        w.set({0, i, j}, j == 5 - i ? 1.0 : 0.0);
        w.set({1, i, j}, 1.0 / 6);
      }
    LayerAttention layer{"layer " + std::to_string(l), w, tokens, tokens};
    d.entropy.push_back({layer.name, mean_row_entropy(w), std::log(6.0)});
    d.layers.push_back(std::move(layer));
  }
  return d;
}

TEST(Entropy, OneHotUniformAndMaskedRows) {
  Tensor w = Tensor::zeros({3, 2, 4}, DType::f64);
  for (int64_t j = 0; j < 4; ++j) w.set({1, 0, j}, 0.25), w.set({1, 1, j}, 0.25);
  w.set({0, 0, 1}, 1.0), w.set({0, 1, 3}, 1.0);
  w.set({2, 0, 0}, 0.5), w.set({2, 0, 1}, 0.5);  // row 1 of head 2 is fully masked: left out
  const std::vector<double> e = mean_row_entropy(w);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_NEAR(e[0], 0.0, 1e-12);
  EXPECT_NEAR(e[1], std::log(4.0), 1e-12);
  EXPECT_NEAR(e[2], std::log(2.0), 1e-12);
  EXPECT_THROW(mean_row_entropy(Tensor::zeros({2, 2}, DType::f32)), Error);
  // No entropy (NaN), never 0 ("near one-hot"): a head with a NaN weight, a head with every row
  // masked.
  w.set({1, 1, 2}, std::numeric_limits<double>::quiet_NaN());
  w.select(0, 2).fill(0.0);
  const std::vector<double> none = mean_row_entropy(w);
  EXPECT_NEAR(none[0], 0.0, 1e-12);
  EXPECT_TRUE(std::isnan(none[1]));
  EXPECT_TRUE(std::isnan(none[2]));
}

TEST(Report, HasEverySectionImageAndChart) {
  const ReportData d = sample_report();
  const std::string html = render_report(d);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* id : {"summary", "training", "gradients", "more-curves", "attention", "entropy"})
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_NE(html.find("reverse &lt;demo&gt;"), std::string::npos);
  EXPECT_EQ(html.find("reverse <demo>"), std::string::npos);
  EXPECT_NE(html.find("<td>held-out accuracy</td><td>0.997</td>"), std::string::npos);
  // One polyline per series; charts loss (2 lines), accuracy, grad_norm, learning rate.
  EXPECT_EQ(count(html, "<polyline"), 5);
  EXPECT_EQ(count(html, "<svg class=\"chart\""), 4);
  EXPECT_LT(html.find("aria-label=\"loss\""), html.find("aria-label=\"accuracy\""));
  EXPECT_LT(html.find("aria-label=\"grad_norm\""), html.find("id=\"more-curves\""));
  // One heatmap picture per layer, each a PNG that decodes.
  int images = 0;
  for (const Image& im : images_of(html)) {
    DecodedPng png(decode_base64(im.base64));
    ASSERT_TRUE(png.ok());
    EXPECT_EQ(png.width(), 2 * im.width);        // drawn at twice the density
    EXPECT_GT(png.count(colormap(1)), 6 * 100);  // six hot cells of head 0 at least
    ++images;
  }
  EXPECT_EQ(images, 2);
  EXPECT_EQ(count(html, "<img"), 2);
}

TEST(Report, FlagsOneHotAndUniformHeads) {
  const std::string html = render_report(sample_report());
  EXPECT_EQ(count(html, "<span class=\"flag onehot\">near one-hot</span></td>"), 2);
  EXPECT_EQ(count(html, "<span class=\"flag uniform\">near uniform</span></td>"), 2);
  // Head 0 (entropy 0) is the one-hot one, head 1 (log 6) the uniform one.
  EXPECT_NE(row_of(html, "<tr><td>layer 0</td><td class=\"num\">0</td><td class=\"num\">0.000</td>")
                .find("near one-hot"),
            std::string::npos);
  EXPECT_NE(row_of(html, "<tr><td>layer 1</td><td class=\"num\">1</td><td class=\"num\">1.792</td>")
                .find("near uniform"),
            std::string::npos);
}

TEST(Report, NothingComesFromTheNetwork) {
  const std::string html = strip_data_uris(render_report(sample_report()));
  // Data URIs are allowed (and base64 may spell anything); everything else must not name a URL.
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find("//"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  const std::regex link("(src|href)=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), link); it != std::sregex_iterator();
       ++it) {
    const std::string attr = (*it)[1], value = (*it)[2];
    if (attr == "src") {
      EXPECT_EQ(value, "data:");
    } else {
      EXPECT_EQ(value.rfind("#", 0), 0u) << value;
    }
  }
}

TEST(Report, EmptyDataStillHasItsSections) {
  const std::string html = render_report({});
  for (const char* id : {"summary", "training", "gradients", "attention", "entropy"})
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_NE(html.find("No attention weights recorded."), std::string::npos);
}

TEST(Report, BadLayerWeightsAreRefused) {
  ReportData d;
  d.layers.push_back({"flat", Tensor::zeros({4, 4}, DType::f32), {}, {}});
  try {
    render_report(d);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("attn::viz::render_report: layers[0] ('flat')", 0), 0u)
        << e.what();
  }
  d.layers[0] = {"tokens", Tensor::zeros({1, 2, 3}, DType::f32), {"a"}, {}};
  EXPECT_THROW(render_report(d), Error);
}

}  // namespace
}  // namespace attn::viz
