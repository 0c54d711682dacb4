#include "viewer/mg2_hud.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "viewer/hud.h"
#include "viewer/palette.h"

namespace wm::viewer {

std::string format_mg2_keys(const worldkv::Mg2Input& in, const std::vector<std::string>& names) {
  if (names.size() == 7) {  // templerun: the one action
    for (size_t i = 0; i < names.size() && i < in.keyboard.size(); ++i)
      if (in.keyboard[i] > 0.5f) return names[i];
    return "-";
  }
  std::string s;
  for (size_t i = 0; i < names.size() && i < in.keyboard.size(); ++i) {
    if (!s.empty()) s += ' ';
    s += in.keyboard[i] > 0.5f ? names[i] : std::string(".");
  }
  return s;
}

std::string mg2_help_keys(const std::string& mode) {
  if (mode == "universal")
    return "W A S D      forward back left right\n"
           "mouse        look (pitch, yaw)\n"
           "arrows       look, 0.1 a frame\n";
  if (mode == "gta_drive")
    return "W S / Up Dn  throttle, brake\n"
           "A D / Lt Rt  steer (yaw -+0.1)\n";
  return "Space W Up   jump\n"
         "S Down       slide\n"
         "A D / Lt Rt  turn left / right\n"
         "Q E          left / right side (Ctrl+Q quits)\n";
}

void draw_mg2_track(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                    const MemorySnapshot* mem, const worldkv::Pose& cam) {
  using namespace palette;
  if (area.w <= 0 || area.h <= 0) return;
  const int cap_h = font.line_height(1) + 4;
  font.draw(area.x, area.y, "track (retrieval pose, from above)", kDim, 1);
  const SDL_Rect box{area.x, area.y + cap_h, area.w, area.h - cap_h};
  if (box.h < 16) return;
  set_color(r, kFloor);
  SDL_RenderFillRect(r, &box);
  if (track.empty()) return;
  // Equal axes over the track and the chunks shown, at least 4 units across.
  double x0 = track[0].x, x1 = x0, y0 = track[0].y, y1 = y0;
  for (const auto& p : track) {
    x0 = std::min(x0, p.x), x1 = std::max(x1, p.x), y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
  }
  x0 = std::min(x0, cam.x), x1 = std::max(x1, cam.x), y0 = std::min(y0, cam.y), y1 = std::max(y1, cam.y);
  const double span = std::max({x1 - x0, y1 - y0, 4.0}) * 1.15;
  const double cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
  const double scale = std::min(box.w, box.h) / span;
  auto to_screen = [&](double x, double y) {
    return SDL_FPoint{static_cast<float>(box.x + box.w / 2.0 + (x - cx) * scale),
                      static_cast<float>(box.y + box.h / 2.0 + (y - cy) * scale)};
  };
  auto dot = [&](const SDL_FPoint& p, float half, SDL_Color c) {
    const SDL_FRect rc{p.x - half, p.y - half, 2 * half + 1, 2 * half + 1};
    set_color(r, c);
    SDL_RenderFillRectF(r, &rc);
  };
  if (track.size() >= 2) {
    std::vector<SDL_FPoint> pts;
    pts.reserve(track.size());
    for (const auto& p : track) pts.push_back(to_screen(p.x, p.y));
    set_color(r, kTrail);
    SDL_RenderDrawLinesF(r, pts.data(), static_cast<int>(pts.size()));
  }
  if (mem) {
    for (const auto& [name, ids] : mem->window)
      for (const auto& id : ids) {
        const int64_t k = chunk_number(id);
        if (k < 0 || k >= static_cast<int64_t>(mem->chunk_poses.size())) continue;
        const auto& p = mem->chunk_poses[static_cast<size_t>(k)];
        dot(to_screen(p.x, p.y), 3, region_color(name.c_str()));
      }
  }
  const SDL_FPoint c = to_screen(cam.x, cam.y);
  const float len = 14;
  set_color(r, kCamera);
  SDL_RenderDrawLineF(r, c.x, c.y, c.x + len * static_cast<float>(std::cos(cam.yaw)),
                      c.y + len * static_cast<float>(std::sin(cam.yaw)));
  dot(c, 3, kCamera);
}

}  // namespace wm::viewer
