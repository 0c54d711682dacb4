#pragma once
// Where things go in the window: on the left the model frame (and the ground-truth frame beside
// it) with the window-regions bar under them; on the right the HUD panel with the minimap. Pure
// arithmetic on the window size; recomputed every redraw, so the window may be resized.
#include <SDL_rect.h>

namespace wm::viewer {

struct Layout {
  SDL_Rect frame{};    // the model's frame, upscaled by `scale`
  SDL_Rect gt{};       // the ground-truth frame (w = 0 when hidden)
  SDL_Rect panel{};    // right column: HUD text on top, minimap below
  SDL_Rect hud{};      // HUD text area inside the panel
  SDL_Rect minimap{};  // square inside the panel
  SDL_Rect bar{};      // the window-regions bar under the frames
  SDL_Rect graph{};    // chunk latency graph under the bar (h = 0 when there is no room)
  int scale = 1;       // whole-number upscale of the frames (nearest neighbour)
};

constexpr int kMargin = 12;
constexpr int kPanelWidth = 400;
constexpr int kBarHeight = 84;
constexpr int kLabelHeight = 22;  // caption strip above the frames
constexpr int kHudHeight = 310;

// Layout for a window of win_w x win_h showing frames of frame_w x frame_h, with the
// ground-truth frame beside the model's when show_gt. fixed_scale > 0 asks for that upscale
// (reduced if it does not fit); 0 takes the largest whole factor that fits.
Layout compute_layout(int win_w, int win_h, int frame_w, int frame_h, bool show_gt, int fixed_scale);

// A window size that fits frames at `scale` side by side with the panel and the bar.
void window_size_for_scale(int scale, int frame_w, int frame_h, int& win_w, int& win_h);

}  // namespace wm::viewer
