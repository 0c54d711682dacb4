#include "viewer/layout.h"

#include <algorithm>

namespace wm::viewer {

Layout compute_layout(int win_w, int win_h, int frame_w, int frame_h, bool show_gt, int fixed_scale) {
  Layout L;
  const int n = show_gt ? 2 : 1;
  L.panel = SDL_Rect{win_w - kPanelWidth, 0, kPanelWidth, win_h};
  L.hud = SDL_Rect{L.panel.x + kMargin, kMargin, kPanelWidth - 2 * kMargin, kHudHeight};
  const int mm_top = L.hud.y + L.hud.h + kMargin;
  const int mm_side = std::max(0, std::min(kPanelWidth - 2 * kMargin, L.panel.h - mm_top - kMargin));
  L.minimap = SDL_Rect{L.panel.x + (kPanelWidth - mm_side) / 2, mm_top, mm_side, mm_side};

  // Frames: the largest whole upscale that fits above the bar.
  const int area_x = kMargin, area_y = kMargin + kLabelHeight;
  const int area_w = std::max(1, L.panel.x - 2 * kMargin);
  const int area_h = std::max(1, win_h - kBarHeight - kMargin - area_y - kMargin);
  const int fit = std::max(1, std::min((area_w - (n - 1) * kMargin) / (n * frame_w), area_h / frame_h));
  L.scale = fixed_scale > 0 ? std::min(fixed_scale, fit) : fit;
  const int fw = frame_w * L.scale, fh = frame_h * L.scale;
  const int used_w = n * fw + (n - 1) * kMargin;
  const int x0 = area_x + std::max(0, (area_w - used_w) / 2);
  L.frame = SDL_Rect{x0, area_y, fw, fh};
  if (show_gt) L.gt = SDL_Rect{x0 + fw + kMargin, area_y, fw, fh};
  // The bar right under the frames, as wide as the left column.
  L.bar = SDL_Rect{kMargin, area_y + fh + 2 * kMargin, area_w, kBarHeight - kMargin};
  const int gy = L.bar.y + L.bar.h + kMargin, gh = win_h - kMargin - gy;
  if (gh >= 64) L.graph = SDL_Rect{kMargin, gy, area_w, std::min(gh, 160)};
  return L;
}

void window_size_for_scale(int scale, int frame_w, int frame_h, int& win_w, int& win_h) {
  win_w = 2 * frame_w * scale + 3 * kMargin + kPanelWidth;
  win_h = std::max(frame_h * scale + kLabelHeight + 3 * kMargin + kBarHeight, kHudHeight + 3 * kMargin + 340);
}

}  // namespace wm::viewer
