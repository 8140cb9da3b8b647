// Helpers for the viz tests: decode PNG bytes with Cairo and read pixels.
#pragma once
#include <cairo.h>

#include <cstdint>
#include <memory>
#include <string>

#include "attn/viz.h"

namespace attn::viz::testing {

class DecodedPng {
 public:
  explicit DecodedPng(const std::string& bytes) : bytes_(bytes) {
    surface_ = cairo_image_surface_create_from_png_stream(&DecodedPng::read, this);
  }
  ~DecodedPng() { cairo_surface_destroy(surface_); }
  DecodedPng(const DecodedPng&) = delete;
  DecodedPng& operator=(const DecodedPng&) = delete;

  bool ok() const { return cairo_surface_status(surface_) == CAIRO_STATUS_SUCCESS; }
  int width() const { return cairo_image_surface_get_width(surface_); }
  int height() const { return cairo_image_surface_get_height(surface_); }
  // The colour at pixel (x, y) (opaque pictures only: premultiplied alpha is ignored).
  Rgb at(int x, int y) const {
    const unsigned char* row =
        cairo_image_surface_get_data(surface_) + y * cairo_image_surface_get_stride(surface_);
    const uint32_t p = reinterpret_cast<const uint32_t*>(row)[x];
    return {static_cast<uint8_t>(p >> 16), static_cast<uint8_t>(p >> 8), static_cast<uint8_t>(p)};
  }
  // How many pixels have exactly colour c.
  int64_t count(Rgb c) const {
    int64_t n = 0;
    for (int y = 0; y < height(); ++y)
      for (int x = 0; x < width(); ++x) n += same(at(x, y), c);
    return n;
  }
  static bool same(Rgb a, Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }

 private:
  static cairo_status_t read(void* closure, unsigned char* data, unsigned int length) {
    auto* self = static_cast<DecodedPng*>(closure);
    if (self->pos_ + length > self->bytes_.size()) return CAIRO_STATUS_READ_ERROR;
    std::copy_n(self->bytes_.data() + self->pos_, length, data);
    self->pos_ += length;
    return CAIRO_STATUS_SUCCESS;
  }
  std::string bytes_;
  size_t pos_ = 0;
  cairo_surface_t* surface_ = nullptr;
};

}  // namespace attn::viz::testing
