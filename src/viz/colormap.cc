// The perceptual colour map: a path through CIELAB whose lightness L* rises linearly from 18 (dark
// violet) to 93 (yellow) while the hue turns through blue, teal and green, like viridis. The table
// is computed here from that recipe (not copied from anywhere); colours that fall outside sRGB keep
// their L* and hue and lose chroma until they fit, so luminance stays monotone.
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "attn/viz.h"
#include "fmt/format.h"

namespace attn::viz {
namespace {

struct Linear {
  double r, g, b;  // linear-light sRGB, in [0, 1] when in gamut
};

// CIELAB (D65 white) -> linear sRGB.
Linear lab_to_linear(double L, double a, double b) {
  const double fy = (L + 16) / 116, fx = fy + a / 500, fz = fy - b / 200;
  auto finv = [](double f) {
    constexpr double d = 6.0 / 29;
    return f > d ? f * f * f : 3 * d * d * (f - 4.0 / 29);
  };
  const double X = 0.95047 * finv(fx), Y = finv(fy), Z = 1.08883 * finv(fz);
  return {3.2404542 * X - 1.5371385 * Y - 0.4985314 * Z,
          -0.9692660 * X + 1.8760108 * Y + 0.0415560 * Z,
          0.0556434 * X - 0.2040259 * Y + 1.0572252 * Z};
}

double encode_srgb(double c) {
  c = std::clamp(c, 0.0, 1.0);
  return c <= 0.0031308 ? 12.92 * c : 1.055 * std::pow(c, 1 / 2.4) - 0.055;
}
double decode_srgb(double c) {
  return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
}

bool in_gamut(const Linear& c) {
  constexpr double eps = 1e-9;
  return c.r >= -eps && c.r <= 1 + eps && c.g >= -eps && c.g <= 1 + eps && c.b >= -eps &&
         c.b <= 1 + eps;
}

constexpr int kTable = 256;
struct Encoded {
  double r, g, b;  // gamma-encoded sRGB in [0, 1]
};

std::array<Encoded, kTable> build_table() {
  std::array<Encoded, kTable> table{};
  for (int k = 0; k < kTable; ++k) {
    const double t = static_cast<double>(k) / (kTable - 1);
    const double L = 18 + 75 * t;
    const double hue =
        (305 - 205 * t) * std::numbers::pi / 180;  // violet -> blue -> teal -> green -> yellow
    // Chroma: a quadratic Bezier 45 -> 25 -> 85, a little duller in the middle and vivid at the
    // yellow end.
    const double wanted = 45 * (1 - t) * (1 - t) + 2 * 25 * t * (1 - t) + 85 * t * t;
    // Largest chroma <= wanted that fits in sRGB (chroma 0 always fits: a grey of the same L*).
    double lo = 0, hi = wanted;
    auto at = [&](double c) { return lab_to_linear(L, c * std::cos(hue), c * std::sin(hue)); };
    if (!in_gamut(at(hi))) {
      for (int it = 0; it < 40; ++it) {
        const double mid = (lo + hi) / 2;
        (in_gamut(at(mid)) ? lo : hi) = mid;
      }
      hi = lo;
    }
    const Linear c = at(hi);
    table[k] = {encode_srgb(c.r), encode_srgb(c.g), encode_srgb(c.b)};
  }
  return table;
}

uint8_t to_byte(double v) {
  return static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255));
}

}  // namespace

Rgb colormap(double t) {
  if (std::isnan(t)) return nan_colour();
  static const std::array<Encoded, kTable> table = build_table();
  const double x = std::clamp(t, 0.0, 1.0) * (kTable - 1);
  const int k = std::min(static_cast<int>(x), kTable - 2);
  const double f = x - k;
  const Encoded& a = table[k];
  const Encoded& b = table[k + 1];
  return {to_byte(a.r + f * (b.r - a.r)), to_byte(a.g + f * (b.g - a.g)),
          to_byte(a.b + f * (b.b - a.b))};
}

Rgb nan_colour() {
  return {255, 64, 160};
}

double relative_luminance(Rgb c) {
  return 0.2126 * decode_srgb(c.r / 255.0) + 0.7152 * decode_srgb(c.g / 255.0) +
         0.0722 * decode_srgb(c.b / 255.0);
}

std::string to_hex(Rgb c) {
  return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b);
}

}  // namespace attn::viz
