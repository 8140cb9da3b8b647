#include <gtest/gtest.h>

#include <cmath>

#include "attn/viz.h"

namespace attn::viz {
namespace {

double distance(Rgb a, Rgb b) {
  return std::sqrt(std::pow(a.r - b.r, 2.0) + std::pow(a.g - b.g, 2.0) + std::pow(a.b - b.b, 2.0));
}

TEST(Colormap, LuminanceRisesMonotonically) {
  // Strictly at a coarse step, and never falls by more than byte rounding at a fine one.
  double previous = -1;
  for (int k = 0; k <= 64; ++k) {
    const double y = relative_luminance(colormap(k / 64.0));
    EXPECT_GT(y, previous) << "t = " << k / 64.0;
    previous = y;
  }
  previous = -1;
  for (int k = 0; k <= 1000; ++k) {
    const double y = relative_luminance(colormap(k / 1000.0));
    EXPECT_GE(y, previous - 1e-3) << "t = " << k / 1000.0;
    previous = std::max(previous, y);
  }
}

TEST(Colormap, DarkVioletToBrightYellow) {
  const Rgb lo = colormap(0), hi = colormap(1), mid = colormap(0.5);
  EXPECT_LT(relative_luminance(lo), 0.05);
  EXPECT_GT(relative_luminance(hi), 0.7);
  EXPECT_GT(lo.b, lo.g);  // violet: blue and red over green
  EXPECT_GT(lo.r, lo.g);
  EXPECT_GT(hi.r, hi.b + 100);  // yellow: red and green over blue
  EXPECT_GT(hi.g, hi.b + 100);
  EXPECT_GT(mid.g, mid.r);  // teal in the middle
  EXPECT_GT(mid.b, mid.r);
}

TEST(Colormap, ClampsAndMarksNaN) {
  EXPECT_EQ(to_hex(colormap(-3)), to_hex(colormap(0)));
  EXPECT_EQ(to_hex(colormap(7)), to_hex(colormap(1)));
  EXPECT_EQ(to_hex(colormap(std::nan(""))), to_hex(nan_colour()));
  // The NaN colour is far from every colour of the map.
  for (int k = 0; k <= 100; ++k) EXPECT_GT(distance(colormap(k / 100.0), nan_colour()), 100) << k;
}

TEST(Colormap, Hex) {
  EXPECT_EQ(to_hex({255, 8, 160}), "#ff08a0");
}

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

}  // namespace
}  // namespace attn::viz
