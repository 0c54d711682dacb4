#pragma once
// An 8-bit RGB image, the unit every producer (world renderer, codec) and consumer (MP4 and
// PNG writers, metrics, viewer) of frames agrees on.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace wm {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3], row-major, interleaved R G B

  Image() = default;
  Image(int w, int h) : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3, 0) {
    if (w <= 0 || h <= 0) throw std::invalid_argument("Image: size must be positive, got " +
                                                      std::to_string(w) + "x" + std::to_string(h));
  }
  uint8_t* pixel(int x, int y) { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
  const uint8_t* pixel(int x, int y) const {
    return rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
  }
  bool empty() const { return rgb.empty(); }
};

}  // namespace wm
