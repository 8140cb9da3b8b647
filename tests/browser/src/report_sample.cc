// attn_report_sample: the browser check's helper.
//   attn_report_sample write REPORT.html      writes a report of a made-up reversal run (no
//   training needed) attn_report_sample check-screenshot S.png  checks that a screenshot of it
//   shows pictures and charts
#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attn/viz.h"

// LeakSanitizer (ASan builds only): Cairo resolves its toy font faces through fontconfig once per
// process and keeps them in static caches that LSan cannot see through; those few hundred bytes are
// reported as leaked at exit. Only allocations made inside libfontconfig are ignored, so leaks of
// attn's own are still caught. Without a sanitizer nothing calls this function.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libfontconfig.so\n";
}

namespace {

using attn::DType;
using attn::Tensor;
using namespace attn::viz;

// Softmax rows of logits that favour one key per query (`target(i)`), with noise; sharpness in
// nats.
Tensor pattern(int64_t heads, const std::vector<std::string>& tokens, std::mt19937& rng) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  Tensor w = Tensor::zeros({heads, n, n}, DType::f32);
  std::normal_distribution<double> noise(0, 0.6);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> logits(n);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t target = h == 0   ? n - 1 - i
                               : h == 1 ? i
                               : h == 2 ? std::max<int64_t>(i - 1, 0)
                                        : -1;
        logits[j] = (target == j ? 6.0 : 0.0) + (h == 3 ? 0.1 * noise(rng) : noise(rng));
        mx = std::max(mx, logits[j]);
      }
      for (double& l : logits) sum += (l = std::exp(l - mx));
      for (int64_t j = 0; j < n; ++j) w.set({h, i, j}, logits[j] / sum);
    }
  return w;
}

int write(const std::string& path) {
  std::mt19937 rng(5);
  ReportData d;
  d.title = "attn demo: reverse (sample report)";
  d.summary = {{"task", "reverse a sequence of 10 digits"},
               {"model", "2 layers, 4 heads, d_model 64"},
               {"steps", "1200"},
               {"held-out accuracy", "0.997"}};
  std::normal_distribution<double> jitter(0, 1);
  for (int s = 0; s <= 1200; s += 10) {
    const double decay = std::exp(-s / 180.0);
    d.series["loss/train"].emplace_back(s,
                                        2.3 * decay + 0.004 + 0.03 * decay * std::abs(jitter(rng)));
    d.series["loss/held-out"].emplace_back(s, 2.35 * decay + 0.008);
    d.series["accuracy/token"].emplace_back(s, 1 - 0.9 * decay);
    d.series["accuracy/sequence"].emplace_back(s, std::pow(1 - 0.9 * decay, 10));
    d.series["grad_norm/total"].emplace_back(
        s, 3 * decay + 0.02 + 0.1 * std::abs(jitter(rng)) * decay);
  }
  const std::vector<std::string> tokens = {"<bos>", "3", "1", "4", "1",
                                           "5",     "9", "2", "6", "<sep>"};
  for (int l = 0; l < 2; ++l) {
    LayerAttention layer{fmt::format("layer {} self-attention", l), pattern(4, tokens, rng), tokens,
                         tokens};
    d.entropy.push_back({layer.name, mean_row_entropy(layer.weights),
                         std::log(static_cast<double>(tokens.size()))});
    d.layers.push_back(std::move(layer));
  }
  write_report(path, d);
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

// The screenshot must show many colours, the hot end of the colour map (heatmap cells) and the
// first line colour of the charts, and must not be mostly one colour.
int check_screenshot(const std::string& path) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
    std::fprintf(stderr, "check-screenshot: cannot read %s as PNG\n", path.c_str());
    return 1;
  }
  const int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  auto near = [](uint32_t p, Rgb c, int tol) {
    return std::abs(static_cast<int>((p >> 16) & 255) - c.r) <= tol &&
           std::abs(static_cast<int>((p >> 8) & 255) - c.g) <= tol &&
           std::abs(static_cast<int>(p & 255) - c.b) <= tol;
  };
  int64_t hot = 0, line = 0, most = 0;
  std::map<uint32_t, int64_t> histogram;
  // The hot end of the map (weights 0.7 .. 1), as the browser may blend cell edges when it scales.
  std::vector<Rgb> hot_colours;
  for (int k = 0; k <= 30; ++k) hot_colours.push_back(colormap(0.7 + 0.01 * k));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const uint32_t p = reinterpret_cast<const uint32_t*>(data + y * stride)[x] & 0xffffffu;
      most = std::max(most, ++histogram[p]);
      hot +=
          std::any_of(hot_colours.begin(), hot_colours.end(), [&](Rgb c) { return near(p, c, 4); });
      line += near(p, {59, 111, 182}, 3);
    }
  cairo_surface_destroy(s);
  const double dominant = static_cast<double>(most) / (static_cast<double>(w) * h);
  std::printf(
      "screenshot %dx%d: %zu colours, dominant colour %.1f%% of pixels, %lld hot-cell pixels, %lld "
      "chart-line "
      "pixels\n",
      w, h, histogram.size(), 100 * dominant, static_cast<long long>(hot),
      static_cast<long long>(line));
  bool ok = true;
  if (histogram.size() < 200)
    std::fprintf(stderr, "FAIL: fewer than 200 colours: blank or unstyled\n"), ok = false;
  if (dominant > 0.95)
    std::fprintf(stderr, "FAIL: one colour covers more than 95%% of the page\n"), ok = false;
  if (hot < 15000)
    std::fprintf(stderr, "FAIL: no heatmap cells in the hot colour: images missing\n"), ok = false;
  if (line < 200) std::fprintf(stderr, "FAIL: no chart lines: charts missing\n"), ok = false;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  try {
    if (mode == "write") return write(argv[2]);
    if (mode == "check-screenshot") return check_screenshot(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_report_sample: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: attn_report_sample write REPORT.html | check-screenshot SHOT.png\n");
  return 2;
}
