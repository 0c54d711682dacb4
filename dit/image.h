#pragma once
// An 8-bit RGB frame: what the codec consumes and produces (dit/codec.h), and so what the
// session hands out and every program, writer, metric and the viewer read. Header-only, no
// libtorch, so that the procedural world and the media tools use it without linking the model.
#include <cstdint>
#include <vector>

#include "runtime/error.h"

namespace wm {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3], row-major, interleaved R G B

  Image() = default;
  // A black w x h image. Throws wm::Error unless both sides are positive.
  Image(int w, int h) : width(w), height(h) {
    WM_CHECK(w > 0 && h > 0, "Image size must be positive, got ", w, "x", h);
    rgb.assign(static_cast<size_t>(w) * h * 3, 0);
  }
  uint8_t* pixel(int x, int y) { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
  const uint8_t* pixel(int x, int y) const {
    return rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
  }
  bool empty() const { return rgb.empty(); }
};

}  // namespace wm
