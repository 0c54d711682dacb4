#include "tools/media/upscale.h"

#include <cstring>

#include "runtime/error.h"

namespace wm::media {

void upscale_into(const wm::Image& src, int s, wm::Image& dst, int x0, int y0) {
  WM_CHECK(s >= 1, "scale must be >= 1, got ", s);
  WM_CHECK(!src.empty() && src.rgb.size() == static_cast<size_t>(src.width) * src.height * 3,
           "source image is empty or its pixel buffer does not match ", src.width, "x", src.height);
  WM_CHECK(x0 >= 0 && y0 >= 0 && static_cast<long long>(x0) + static_cast<long long>(src.width) * s <= dst.width &&
               static_cast<long long>(y0) + static_cast<long long>(src.height) * s <= dst.height,
           src.width, "x", src.height, " scaled by ", s, " at (", x0, ", ", y0, ") does not fit in ", dst.width, "x",
           dst.height);
  const size_t row_bytes = static_cast<size_t>(dst.width) * 3;
  for (int y = 0; y < src.height; ++y) {
    // One scaled row, then copied to the block's other s - 1 rows.
    uint8_t* row = dst.pixel(x0, y0 + y * s);
    const uint8_t* p = src.pixel(0, y);
    uint8_t* d = row;
    for (int x = 0; x < src.width; ++x, p += 3)
      for (int k = 0; k < s; ++k, d += 3) std::memcpy(d, p, 3);
    const size_t scaled_bytes = static_cast<size_t>(src.width) * s * 3;
    for (int k = 1; k < s; ++k) std::memcpy(row + k * row_bytes, row, scaled_bytes);
  }
}

}  // namespace wm::media
