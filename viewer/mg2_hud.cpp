#include "viewer/mg2_hud.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "viewer/hud.h"
#include "viewer/palette.h"

namespace wm::viewer {

namespace {

// Milliseconds as seconds with three significant digits (chunks take 0.1 s on a GPU, minutes
// on a CPU).
std::string secs(double ms) {
  const double v = ms / 1000.0;
  return fmt(v < 10 ? "%.2f" : v < 100 ? "%.1f" : "%.0f", v);
}

}  // namespace

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

std::string mg2_help_text(const std::string& mode) {
  std::string keys;
  if (mode == "universal") {
    keys = "W A S D      forward back left right\n"
           "mouse        look (pitch, yaw)\n"
           "arrows       look, 0.1 a frame\n";
  } else if (mode == "gta_drive") {
    keys = "W S / Up Dn  throttle, brake\n"
           "A D / Lt Rt  steer (yaw -+0.1)\n";
  } else {
    keys = "Space W Up   jump\n"
           "S Down       slide\n"
           "A D / Lt Rt  turn left / right\n"
           "Q E          left / right side\n";
  }
  if (mode == "universal") keys += "Esc          release the mouse\n";
  return keys +
         "0 native     1 full_kv\n"
         "2 sliding_window  3 worldkv\n"
         "4 worldkv_c  5 sink_recent\n"
         "             (restart from frame 1)\n"
         "N            restart from frame 1\n"
         "R            record MP4 on/off\n"
         "P            pause\n"
         "H / F1       this help\n" +
         std::string(mode == "templerun" ? "Ctrl+Q       quit" : "Q, Ctrl+Q    quit");
}

void draw_mg2_hud(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& a, const Mg2HudInfo& h) {
  using namespace palette;
  (void)r;
  const int s = 2, lh = kCellH * s + 1;
  int y = a.y;
  auto line = [&](const std::string& label, const std::string& value, SDL_Color vc = kText) {
    font.draw(a.x, y, label, kDim, s);
    font.draw(a.x + 8 * kCellW * s, y, value, vc, s);  // labels of at most 7 characters
    y += lh;
  };
  font.draw(a.x, y, "MG2", kAccent, s);
  font.draw(a.x + 4 * kCellW * s, y, h.model, kDim, 1);
  font.draw(a.x + 4 * kCellW * s, y + kCellH + 1, h.device, kDim, 1);
  y += lh + 4;
  line("mode", h.mode, kAccent);
  line("policy", h.policy, kAccent);
  line("chunk", std::to_string(std::max<int64_t>(0, h.chunks - 1)) + "  (" + std::to_string(h.frames) + " fr)");
  line("gen", fmt("%.1f fps", h.gen_fps) + fmt("  model %.1f", h.model_fps));
  line("latency", secs(h.last_ms) + "s p50 " + secs(h.p50_ms) + " p90 " + secs(h.p90_ms));
  line("DiT/VAE", secs(h.dit_ms) + "s / " + secs(h.decode_ms) + "s");
  line("window", h.chunks > 0 ? format_bytes(h.window_bytes) : "-");
  line("act K/V", h.chunks > 0 ? format_bytes(h.action_bytes) : "-");
  if (h.memory && h.policy != "native") {
    const auto& m = *h.memory;
    const size_t n = m.tier_count[0] + m.tier_count[1] + m.tier_count[2];
    line("bank", std::to_string(n) + " chunks " + format_bytes(m.tier_bytes[0] + m.tier_bytes[1] + m.tier_bytes[2]));
  } else {
    line("bank", "-", kDim);
  }
  if (h.input) {
    std::string v = format_mg2_keys(*h.input, h.keyboard_names);
    if (h.mode != "templerun") v += fmt(" p%+.2f", h.input->pitch) + fmt(" y%+.2f", h.input->yaw);
    line("input", v);
  } else {
    line("input", "-", kDim);
  }
  line("pose", fmt("x%.1f", h.pose.x) + fmt(" y%.1f", h.pose.y) + fmt(" yaw%.0f", h.pose.yaw / worldkv::kRadiansPerDegree) +
                   fmt(" p%.0f", h.pose.pitch / worldkv::kRadiansPerDegree));
  int x = a.x;
  auto flag = [&](const std::string& t, SDL_Color c) { x = font.draw(x, y, t, c, s) + kCellW * s; };
  if (h.recording) flag("REC " + fmt("%.0fs", h.record_s), kWarn);
  if (h.paused) flag("PAUSED", kRetrieved);
  if (h.mode == "universal") flag(h.captured ? "mouse: Esc frees" : "click: capture", kDim);
  y += lh;
  font.draw(a.x, y, h.status.empty() ? "H: help" : h.status, h.status.empty() ? kDim : kAccent, s);
}

void draw_mg2_track(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                    const MemorySnapshot* mem) {
  using namespace palette;
  if (area.w <= 0 || area.h <= 0) return;
  const int cap_h = kCellH + 4;
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
  const worldkv::Pose& cam = track.back();
  const SDL_FPoint c = to_screen(cam.x, cam.y);
  const float len = 14;
  set_color(r, kCamera);
  SDL_RenderDrawLineF(r, c.x, c.y, c.x + len * static_cast<float>(std::cos(cam.yaw)),
                      c.y + len * static_cast<float>(std::sin(cam.yaw)));
  dot(c, 3, kCamera);
}

}  // namespace wm::viewer
