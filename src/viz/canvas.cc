#include "viz/canvas.h"

#include <cairo-svg.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "attn/error.h"

namespace attn::viz::detail {
namespace {

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

void select_font(cairo_t* cr, double size, bool bold) {
  cairo_select_font_face(cr, kFontFamily, CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

void check(cairo_status_t status, const char* what) {
  if (status != CAIRO_STATUS_SUCCESS)
    throw Error(
        fmt::format("attn::viz: {}: cairo error: {}", what, cairo_status_to_string(status)));
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')
          out += '?';
        else
          out += static_cast<char>(ch);
    }
  }
  return out;
}

double text_width(const std::string& s, double size, bool bold) {
  // A scratch surface per thread: text metrics do not depend on the target surface.
  struct Scratch {
    cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
    cairo_t* cr = cairo_create(surface);
    ~Scratch() {
      cairo_destroy(cr);
      cairo_surface_destroy(surface);
    }
  };
  thread_local Scratch scratch;
  select_font(scratch.cr, size, bold);
  cairo_text_extents_t ext;
  cairo_text_extents(scratch.cr, s.c_str(), &ext);
  return ext.x_advance;
}

Canvas::Canvas(ImageFormat format, double width, double height, double scale)
    : format_(format), width_(width), height_(height) {
  if (format == ImageFormat::png) {
    const int w = static_cast<int>(std::ceil(width * scale));
    const int h = static_cast<int>(std::ceil(height * scale));
    surface_ = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);  // opaque: RGB PNG
    if (cairo_surface_status(surface_) != CAIRO_STATUS_SUCCESS) {
      const cairo_status_t status = cairo_surface_status(surface_);
      cairo_surface_destroy(surface_);  // the destructor does not run when the constructor throws
      surface_ = nullptr;
      check(status, "image surface");
    }
    cr_ = cairo_create(surface_);
    cairo_scale(cr_, scale, scale);
  } else {
    surface_ = cairo_svg_surface_create_for_stream(append_bytes, &svg_bytes_, width, height);
    if (cairo_surface_status(surface_) != CAIRO_STATUS_SUCCESS) {
      const cairo_status_t status = cairo_surface_status(surface_);
      cairo_surface_destroy(surface_);
      surface_ = nullptr;
      check(status, "svg surface");
    }
    cairo_svg_surface_set_document_unit(surface_, CAIRO_SVG_UNIT_PX);
    cr_ = cairo_create(surface_);
  }
  // White background: the pictures are meant to be dropped into documents and viewers of any theme.
  fill_rect(0, 0, width, height, {255, 255, 255});
}

Canvas::~Canvas() {
  if (cr_) cairo_destroy(cr_);
  if (surface_) cairo_surface_destroy(surface_);
}

void Canvas::fill_rect(double x, double y, double w, double h, Rgb c) {
  cairo_set_source_rgb(cr_, c.r / 255.0, c.g / 255.0, c.b / 255.0);
  cairo_rectangle(cr_, x, y, w, h);
  cairo_fill(cr_);
}

void Canvas::text(double x, double y, const std::string& s, const TextStyle& style) {
  if (s.empty()) return;
  if (format_ == ImageFormat::svg) {
    const char* anchor = style.anchor == Anchor::start    ? "start"
                         : style.anchor == Anchor::middle ? "middle"
                                                          : "end";
    std::string placement =
        style.vertical ? fmt::format("transform=\"translate({:.2f},{:.2f}) rotate(-90)\"", x, y)
                       : fmt::format("x=\"{:.2f}\" y=\"{:.2f}\"", x, y);
    svg_text_ += fmt::format(
        "<text {} font-family=\"{}, Liberation Sans, Arial, sans-serif\" font-size=\"{:.2f}\"{} "
        "text-anchor=\"{}\" fill=\"{}\">{}</text>\n",
        placement, kFontFamily, style.size, style.bold ? " font-weight=\"bold\"" : "", anchor,
        to_hex(style.colour), xml_escape(s));
    return;
  }
  cairo_save(cr_);
  select_font(cr_, style.size, style.bold);
  cairo_text_extents_t ext;
  cairo_text_extents(cr_, s.c_str(), &ext);
  const double shift = style.anchor == Anchor::start    ? 0
                       : style.anchor == Anchor::middle ? ext.x_advance / 2
                                                        : ext.x_advance;
  cairo_translate(cr_, x, y);
  if (style.vertical) cairo_rotate(cr_, -std::numbers::pi / 2);
  cairo_move_to(cr_, -shift, 0);
  cairo_set_source_rgb(cr_, style.colour.r / 255.0, style.colour.g / 255.0, style.colour.b / 255.0);
  cairo_show_text(cr_, s.c_str());
  cairo_restore(cr_);
}

std::string Canvas::finish() {
  check(cairo_status(cr_), "drawing");
  cairo_destroy(cr_);
  cr_ = nullptr;
  std::string out;
  if (format_ == ImageFormat::png) {
    cairo_surface_flush(surface_);
    check(cairo_surface_write_to_png_stream(surface_, append_bytes, &out), "png encoding");
  } else {
    cairo_surface_finish(surface_);
    check(cairo_surface_status(surface_), "svg encoding");
    out = std::move(svg_bytes_);
    const size_t end = out.rfind("</svg>");
    if (end == std::string::npos) throw Error("attn::viz: svg encoding: cairo wrote no </svg>");
    out.insert(end, svg_text_);
  }
  cairo_surface_destroy(surface_);
  surface_ = nullptr;
  return out;
}

}  // namespace attn::viz::detail
