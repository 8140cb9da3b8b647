// Canvas: one drawing interface over two Cairo surfaces. Shapes go through Cairo on both; text is
// drawn by Cairo on PNG and written as real <text> elements on SVG (Cairo would turn it into glyph
// outlines, which nobody can search or copy), placed by the same coordinates.
#pragma once
#include <cairo.h>

#include <string>
#include <vector>

#include "attn/viz.h"

namespace attn::viz::detail {

enum class Anchor { start, middle, end };

struct TextStyle {
  double size = 12;
  bool bold = false;
  Anchor anchor = Anchor::start;
  bool vertical = false;  // rotated by -90 degrees: reads bottom to top
  Rgb colour{34, 34, 34};
};

// The font both surfaces use; the SVG names fallbacks for browsers without it.
inline constexpr const char* kFontFamily = "DejaVu Sans";

class Canvas {
 public:
  // width, height in user units (CSS pixels); PNG pixels = units * scale.
  Canvas(ImageFormat format, double width, double height, double scale);
  ~Canvas();
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;

  cairo_t* cr() const { return cr_; }
  ImageFormat format() const { return format_; }
  // Fills a rectangle with a colour.
  void fill_rect(double x, double y, double w, double h, Rgb c);
  // (x, y) is the baseline point that `anchor` refers to (for vertical text: after the -90 degree
  // turn).
  void text(double x, double y, const std::string& s, const TextStyle& style);
  // Encoded bytes; the canvas cannot be drawn on afterwards.
  std::string finish();

 private:
  ImageFormat format_;
  double width_, height_;
  cairo_surface_t* surface_ = nullptr;
  cairo_t* cr_ = nullptr;
  std::string svg_bytes_;
  std::string svg_text_;  // <text> elements added before </svg>
};

// Advance width of `s` at `size` (same font as Canvas::text), measured with Cairo.
double text_width(const std::string& s, double size, bool bold = false);

// XML text escaping; control characters that XML 1.0 forbids become '?'.
std::string xml_escape(const std::string& s);

}  // namespace attn::viz::detail
