#include "tools/world/raycaster.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace wm::world {

void validate(const RenderSpec& s) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    throw wm::Error("RenderSpec." + field + ": expected " + expected + ", got " + got);
  };
  if (s.width < 1 || s.width > 8192) bad("width", "1..8192", std::to_string(s.width));
  if (s.height < 1 || s.height > 8192) bad("height", "1..8192", std::to_string(s.height));
  if (!(s.fov_deg >= 10 && s.fov_deg <= 170)) bad("fov_deg", "10..170", std::to_string(s.fov_deg));
  if (s.supersample < 1 || s.supersample > 8) bad("supersample", "1..8", std::to_string(s.supersample));
}

namespace {

// Where a ray from (x, y) along (rx, ry) meets a wall, by DDA over the grid: the perpendicular
// distance (at least 1e-4), the side crossed (0: a vertical grid line, 1: a horizontal one), the
// wall's cell and the cell before it. From inside a wall: that wall.
struct WallHit {
  double perp;
  int side, mx, my, prev_x, prev_y;
};

inline WallHit cast_ray(const Scene& sc, double x, double y, double rx, double ry) {
  int mx = static_cast<int>(std::floor(x)), my = static_cast<int>(std::floor(y));
  const double ddx = rx == 0 ? 1e30 : std::fabs(1.0 / rx), ddy = ry == 0 ? 1e30 : std::fabs(1.0 / ry);
  int sx, sy;
  double side_x, side_y;
  if (rx < 0) { sx = -1; side_x = (x - mx) * ddx; } else { sx = 1; side_x = (mx + 1.0 - x) * ddx; }
  if (ry < 0) { sy = -1; side_y = (y - my) * ddy; } else { sy = 1; side_y = (my + 1.0 - y) * ddy; }
  int side = 0, prev_x = mx, prev_y = my;
  bool hit = sc.is_solid(mx, my);  // camera inside a wall: show that wall
  for (int steps = 0; !hit && steps < 4 * (sc.width + sc.height); ++steps) {
    prev_x = mx;
    prev_y = my;
    if (side_x < side_y) { side_x += ddx; mx += sx; side = 0; } else { side_y += ddy; my += sy; side = 1; }
    hit = sc.is_solid(mx, my);
  }
  const double perp = side == 0 ? side_x - ddx : side_y - ddy;
  return {std::max(perp, 1e-4), side, mx, my, prev_x, prev_y};
}

// The texture of the wall hit: its landmark's, else the wall material of the zone the ray came
// from.
inline int wall_texture(const Scene& sc, const WallHit& w) {
  const int16_t lm = (w.mx >= 0 && w.my >= 0 && w.mx < sc.width && w.my < sc.height)
                         ? sc.landmark[static_cast<size_t>(w.my) * sc.width + w.mx]
                         : -1;
  if (lm >= 0) return lm;
  const int16_t z = (w.prev_x >= 0 && w.prev_y >= 0 && w.prev_x < sc.width && w.prev_y < sc.height)
                        ? sc.zone[static_cast<size_t>(w.prev_y) * sc.width + w.prev_x]
                        : -1;
  return sc.zone_material[z >= 0 ? z : 0].wall;
}

// The floor's (or ceiling's) texel at world point (wx, wy), its cell clamped to the scene;
// *gain its shade (the floor's baked shading, 1 for a ceiling).
inline const uint8_t* floor_texel(const Scene& sc, double wx, double wy, bool floor, float* gain) {
  const int T = Texture::kSize;
  int cx = static_cast<int>(std::floor(wx)), cy = static_cast<int>(std::floor(wy));
  cx = std::clamp(cx, 0, sc.width - 1);
  cy = std::clamp(cy, 0, sc.height - 1);
  const size_t ci = static_cast<size_t>(cy) * sc.width + cx;
  const int16_t z = sc.zone[ci];
  const Material& m = sc.zone_material[z >= 0 ? z : 0];
  const Texture& t = sc.textures[floor ? m.floor : m.ceiling];
  int u = static_cast<int>((wx - std::floor(wx)) * T), v = static_cast<int>((wy - std::floor(wy)) * T);
  u = std::clamp(u, 0, T - 1);
  v = std::clamp(v, 0, T - 1);
  *gain = floor ? sc.floor_shade[ci] * (1.0f / 128.0f) : 1.0f;
  return t.at(u, v);
}

}  // namespace

Raycaster::Raycaster(const Scene& scene, RenderSpec spec) : scene_(scene), spec_(spec) {
  validate(spec_);
  if (scene_.width <= 0 || scene_.solid.size() != static_cast<size_t>(scene_.width) * scene_.height)
    throw wm::Error("Raycaster: scene is empty or inconsistent");
}

wm::Image Raycaster::render(const Pose& pose) const {
  wm::Image img(spec_.width, spec_.height);
  render(pose, img);
  return img;
}

void Raycaster::render(const Pose& pose, wm::Image& out) const {
  if (out.width != spec_.width || out.height != spec_.height || out.rgb.size() != static_cast<size_t>(spec_.width) * spec_.height * 3)
    out = wm::Image(spec_.width, spec_.height);
  const Scene& sc = scene_;
  const int ss = spec_.supersample;
  const int W = spec_.width * ss, H = spec_.height * ss;
  const int T = Texture::kSize;

  double dx, dy;
  heading(pose.yaw_deg, dx, dy);
  const double half = std::tan(spec_.fov_deg * (M_PI / 360.0));
  const double px = -dy * half, py = dx * half;        // camera plane (to the right), |plane| = tan(fov/2)
  const double focal = (W * 0.5) / half;               // pixels per unit at distance 1
  const double horizon = H * 0.5 + focal * std::tan(pose.pitch_deg * (M_PI / 180.0));
  const double cam_z = 0.5;                             // eye height; walls span z in [0, 1]
  const float fr = sc.fog.r, fg = sc.fog.g, fb = sc.fog.b;
  const float density = static_cast<float>(sc.fog_density);

  // Per-row distance (along the view direction) of the floor or ceiling point, and its fog.
  thread_local std::vector<float> row_dist, row_fog, accum;
  row_dist.resize(H);
  row_fog.resize(H);
  for (int y = 0; y < H; ++y) {
    double yc = y + 0.5 - horizon;
    double d = yc > 0 ? cam_z * focal / yc : yc < 0 ? (1.0 - cam_z) * focal / -yc : 1e9;
    d = std::min(d, 1e4);
    row_dist[y] = static_cast<float>(d);
    row_fog[y] = std::exp(-density * static_cast<float>(d));
  }
  accum.assign(static_cast<size_t>(spec_.width) * spec_.height * 3, 0.0f);

  for (int x = 0; x < W; ++x) {
    const double cam_x = 2.0 * (x + 0.5) / W - 1.0;
    const double rx = dx + px * cam_x, ry = dy + py * cam_x;
    const WallHit w = cast_ray(sc, pose.x, pose.y, rx, ry);
    const int side = w.side;
    const double perp = w.perp;
    double wall_u = side == 0 ? pose.y + perp * ry : pose.x + perp * rx;
    wall_u -= std::floor(wall_u);
    int tu = static_cast<int>(wall_u * T);
    if ((side == 0 && rx < 0) || (side == 1 && ry > 0)) tu = T - 1 - tu;  // keep textures unmirrored
    tu = std::clamp(tu, 0, T - 1);
    const Texture& wt = sc.textures[wall_texture(sc, w)];
    const float wall_fog = std::exp(-density * static_cast<float>(perp));
    const float wall_gain = (side == 1 ? static_cast<float>(sc.side_shade) : 1.0f) * wall_fog;
    const float wall_fog_r = fr * (1 - wall_fog), wall_fog_g = fg * (1 - wall_fog), wall_fog_b = fb * (1 - wall_fog);
    const double line = focal / perp;  // wall height in pixels
    const double top = horizon - (1.0 - cam_z) * line, bottom = horizon + cam_z * line;
    const int y0 = std::max(0, static_cast<int>(std::ceil(top - 0.5))), y1 = std::min(H, static_cast<int>(std::ceil(bottom - 0.5)));
    float* acc_col = accum.data() + static_cast<size_t>(x / ss) * 3;
    const size_t acc_row_stride = static_cast<size_t>(spec_.width) * 3;

    for (int y = 0; y < H; ++y) {
      float r, g, b;
      if (y >= y0 && y < y1) {
        int tv = static_cast<int>((y + 0.5 - top) / line * T);
        tv = std::clamp(tv, 0, T - 1);
        const uint8_t* t = wt.at(tu, tv);
        r = t[0] * wall_gain + wall_fog_r;
        g = t[1] * wall_gain + wall_fog_g;
        b = t[2] * wall_gain + wall_fog_b;
      } else {
        const float d = row_dist[y];
        const double wx = pose.x + d * rx, wy = pose.y + d * ry;
        const bool floor = y >= horizon;
        float gain;
        const uint8_t* p = floor_texel(sc, wx, wy, floor, &gain);
        const float f = row_fog[y];
        gain *= f;
        r = p[0] * gain + fr * (1 - f);
        g = p[1] * gain + fg * (1 - f);
        b = p[2] * gain + fb * (1 - f);
      }
      float* a = acc_col + static_cast<size_t>(y / ss) * acc_row_stride;
      a[0] += r;
      a[1] += g;
      a[2] += b;
    }
  }
  const float norm = 1.0f / (ss * ss);
  uint8_t* o = out.rgb.data();
  for (size_t i = 0; i < accum.size(); ++i) {
    float v = accum[i] * norm + 0.5f;
    o[i] = static_cast<uint8_t>(v >= 255.f ? 255.f : v <= 0.f ? 0.f : v);
  }
}

}  // namespace wm::world
