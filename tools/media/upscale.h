#pragma once
// Nearest-neighbour integer upscale of RGB8 frames: each pixel becomes an s x s block. The one
// implementation behind Mp4Writer's upscale and the programs that compose upscaled frames into a
// larger canvas (wm_render's side by side, wm_revisit_bench's revisit-pair PNGs).
#include "dit/image.h"

namespace wm::media {

// Writes src scaled by s into dst with its top-left corner at (x0, y0). Throws wm::Error when
// s < 1, src is empty, or the scaled image does not fit inside dst there.
void upscale_into(const wm::Image& src, int s, wm::Image& dst, int x0 = 0, int y0 = 0);

}  // namespace wm::media
