#include "viewer/minimap.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "viewer/hud.h"
#include "viewer/palette.h"

namespace wm::viewer {

void Minimap::set_scene(SDL_Renderer* r, const world::Scene& scene) {
  w_ = scene.width;
  h_ = scene.height;
  std::vector<uint8_t> rgb(static_cast<size_t>(w_) * h_ * 3);
  for (int y = 0; y < h_; ++y)
    for (int x = 0; x < w_; ++x) {
      const size_t i = static_cast<size_t>(y) * w_ + x;
      SDL_Color c = palette::kFloor;
      if (scene.solid[i]) c = scene.landmark[i] >= 0 ? palette::kLandmark : palette::kWall;
      rgb[i * 3] = c.r;
      rgb[i * 3 + 1] = c.g;
      rgb[i * 3 + 2] = c.b;
    }
  map_.reset(SDL_CreateTexture(r, SDL_PIXELFORMAT_RGB24, SDL_TEXTUREACCESS_STATIC, w_, h_));
  if (!map_) throw Error(sdl_error("Minimap: SDL_CreateTexture"));
  SDL_SetTextureScaleMode(map_.get(), SDL_ScaleModeNearest);
  if (SDL_UpdateTexture(map_.get(), nullptr, rgb.data(), w_ * 3) != 0) throw Error(sdl_error("Minimap: SDL_UpdateTexture"));
}

void Minimap::draw(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<world::Pose>& trail,
                   const MemorySnapshot* mem, const world::Pose& cam, double fov_deg) const {
  using namespace palette;
  if (!map_ || area.w <= 0 || area.h <= 0) return;
  const int legend_h = font.line_height(1) + 4, map_h = area.h - legend_h;
  const int cell = std::max(1, std::min(area.w / w_, map_h / h_));
  const SDL_Rect map{area.x + (area.w - cell * w_) / 2, area.y + std::max(0, (map_h - cell * h_) / 2), cell * w_, cell * h_};
  SDL_RenderCopy(r, map_.get(), nullptr, &map);
  auto to_screen = [&](double x, double y) {
    return SDL_FPoint{static_cast<float>(map.x + x * cell), static_cast<float>(map.y + y * cell)};
  };
  auto dot = [&](double x, double y, int half, SDL_Color c) {
    const SDL_FPoint p = to_screen(x, y);
    const SDL_FRect rc{p.x - half, p.y - half, 2.0f * half + 1, 2.0f * half + 1};
    set_color(r, c);
    SDL_RenderFillRectF(r, &rc);
  };

  // Trajectory.
  if (trail.size() >= 2) {
    std::vector<SDL_FPoint> pts;
    pts.reserve(trail.size());
    for (const auto& p : trail) pts.push_back(to_screen(p.x, p.y));
    set_color(r, kTrail);
    SDL_RenderDrawLinesF(r, pts.data(), static_cast<int>(pts.size()));
  }

  // Chunks: banked (dim), in the window (region colour), retrieved now (bright, linked to the camera).
  if (mem) {
    auto pose_of = [&](const std::string& id, world::Pose& out) {
      const int64_t k = chunk_number(id);
      if (k < 0 || k >= static_cast<int64_t>(mem->chunk_poses.size())) return false;
      out.x = mem->chunk_poses[k].x;
      out.y = mem->chunk_poses[k].y;
      return true;
    };
    const int half = std::max(2, cell / 3);
    world::Pose p;
    for (const auto& id : mem->banked)
      if (pose_of(id, p)) dot(p.x, p.y, half - 1, kBanked);
    for (const auto& [name, ids] : mem->window) {
      if (name == "denoise") continue;
      for (const auto& id : ids)
        if (pose_of(id, p)) dot(p.x, p.y, half - 1, region_color(name.c_str()));
    }
    for (const auto& [name, ids] : mem->window) {
      if (name != "retrieved") continue;
      for (const auto& id : ids) {
        if (!pose_of(id, p)) continue;
        const SDL_FPoint a = to_screen(p.x, p.y), b = to_screen(cam.x, cam.y);
        set_color(r, kRetrieved);
        SDL_RenderDrawLineF(r, a.x, a.y, b.x, b.y);
        // A hollow square: the chunk's own marker stays visible inside.
        const float h = static_cast<float>(half + 2);
        const SDL_FRect box{a.x - h, a.y - h, 2 * h + 1, 2 * h + 1};
        SDL_RenderDrawRectF(r, &box);
      }
    }
  }

  // Camera: field-of-view edges, heading, body.
  const SDL_FPoint c = to_screen(cam.x, cam.y);
  auto ray = [&](double yaw_deg, double len, SDL_Color col) {
    double dx, dy;
    world::heading(yaw_deg, dx, dy);
    const SDL_FPoint e = to_screen(cam.x + dx * len, cam.y + dy * len);
    set_color(r, col);
    SDL_RenderDrawLineF(r, c.x, c.y, e.x, e.y);
  };
  ray(cam.yaw_deg - fov_deg / 2, 2.0, kDim);
  ray(cam.yaw_deg + fov_deg / 2, 2.0, kDim);
  ray(cam.yaw_deg, 2.5, kCamera);
  ray(cam.yaw_deg + 0.8, 2.5, kCamera);  // a thicker heading line
  dot(cam.x, cam.y, std::max(2, cell / 3), kCamera);

  // Legend along the bottom of the area.
  const int ly = area.y + area.h - font.line_height(1);
  int x = area.x;
  x = font.draw(x, ly, "trail", kTrail, 1) + 10;
  x = font.draw(x, ly, "banked", kBanked, 1) + 10;
  x = font.draw(x, ly, "sink", kSink, 1) + 10;
  x = font.draw(x, ly, "recent", kRecent, 1) + 10;
  x = font.draw(x, ly, "retrieved", kRetrieved, 1) + 10;
  font.draw(x, ly, "landmark", kLandmark, 1);
}

}  // namespace wm::viewer
