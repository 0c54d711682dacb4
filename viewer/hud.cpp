#include "viewer/hud.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>

namespace wm::viewer {

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

std::string format_ms(double ms) {
  if (ms < 10000) return fmt("%.0f ms", ms);
  return fmt(ms < 100000 ? "%.1f s" : "%.0f s", ms / 1000.0);
}

std::string format_ms_list(const std::vector<double>& ms, const std::vector<std::string>& labels) {
  double top = 0;
  for (double v : ms) top = std::max(top, v);
  const bool secs = top >= 10000;
  std::string out;
  for (size_t i = 0; i < ms.size(); ++i)
    out += (i < labels.size() ? labels[i] : " ") + fmt(secs ? (top < 100000 ? "%.1f" : "%.0f") : "%.0f", secs ? ms[i] / 1000 : ms[i]);
  return out + (secs ? " s" : " ms");
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double v = -1;
  if (f >> v) return v;
  return -1;
}

namespace {

void fill(SDL_Renderer* r, const SDL_Rect& rc, SDL_Color c) {
  palette::set_color(r, c);
  SDL_RenderFillRect(r, &rc);
}

void outline(SDL_Renderer* r, const SDL_Rect& rc, SDL_Color c) {
  palette::set_color(r, c);
  SDL_RenderDrawRect(r, &rc);
}

// The bank's lines: chunks and bytes, then the count per tier.
void bank_lines(const HudInfo& h, const std::function<void(const std::string&, const std::string&, SDL_Color)>& line) {
  using namespace palette;
  if (!h.memory || h.memory->policy == "native" || h.memory->policy.empty()) {
    line("bank", "- (no bank)", kDim);
    return;
  }
  const auto& m = *h.memory;
  const size_t n = m.tier_count[0] + m.tier_count[1] + m.tier_count[2];
  line("bank", std::to_string(n) + " chunks  " + format_bytes(m.tier_bytes[0] + m.tier_bytes[1] + m.tier_bytes[2]),
       kText);
  line("  tiers", "dev " + std::to_string(m.tier_count[0]) + "  host " + std::to_string(m.tier_count[1]) + "  disk " +
                      std::to_string(m.tier_count[2]),
       n ? kText : kDim);
}

}  // namespace

std::string format_bytes(size_t bytes) {
  char b[32];
  if (bytes >= (1u << 30)) std::snprintf(b, sizeof b, "%.2f GB", bytes / double(1u << 30));
  else if (bytes >= (1u << 20)) std::snprintf(b, sizeof b, "%.2f MB", bytes / double(1u << 20));
  else if (bytes >= (1u << 10)) std::snprintf(b, sizeof b, "%.1f KB", bytes / double(1u << 10));
  else std::snprintf(b, sizeof b, "%zu B", bytes);
  return b;
}

int64_t chunk_number(const std::string& id) {
  const std::string prefix = "chunk:";
  if (id.compare(0, prefix.size(), prefix) != 0 || id.size() == prefix.size()) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(id.c_str() + prefix.size(), &end, 10);
  return *end == '\0' ? static_cast<int64_t>(v) : -1;
}

void draw_hud(SDL_Renderer* r, const Font& font, const SDL_Rect& a, const HudInfo& h) {
  using namespace palette;
  (void)r;
  const int lh = font.line_height(2) + 1, value_x = a.x + 8 * font.advance(2);  // labels of 7 at most
  int y = a.y;
  const auto line = [&](const std::string& label, const std::string& value, SDL_Color vc) {
    font.draw(a.x, y, label, kDim, 2);
    const size_t fit = static_cast<size_t>(std::max(1, (a.x + a.w - value_x) / font.advance(2)));
    font.draw(value_x, y, value.substr(0, fit), vc, 2);
    y += lh;
  };
  // The model kind, and the model and the device beside it.
  const int x = font.draw(a.x, y, h.header, kAccent, 2) + font.advance(2);
  const size_t fit = static_cast<size_t>(std::max(1, (a.x + a.w - x) / font.advance(1)));
  font.draw(x, y, h.model.substr(0, fit), kDim, 1);
  font.draw(x, y + font.line_height(1), h.device.substr(0, fit), kDim, 1);
  y += std::max(lh, 2 * font.line_height(1)) + 4;
  line("policy", h.policy, kAccent);
  for (const HudLine& l : h.model_lines) line(l.label, l.value, l.color);
  line("chunk", std::to_string(std::max<int64_t>(0, h.chunks - 1)) + "  (" + std::to_string(h.frames) + " frames)", kText);
  line("gen", fmt("%.1f fps", h.gen_fps) + fmt("  model %.1f", h.model_fps), kText);
  line("latency", format_ms_list({h.last_ms, h.p50_ms, h.p90_ms}, {"", "  p50 ", "  p90 "}), kText);
  line("  of it", format_ms_list({h.model_ms, h.decode_ms}, {"model ", "  decode "}), kText);
  line("pose", fmt("%.2f", h.pose.x) + fmt(", %.2f", h.pose.y) + fmt("  yaw %.1f", worldkv::degrees(h.pose.yaw)) +
                   fmt("  p %.0f", worldkv::degrees(h.pose.pitch)),
       kText);
  for (const HudLine& l : h.input_lines) line(l.label, l.value, l.color);
  line("window", h.chunks > 0 ? format_bytes(h.window_bytes) : "-", kText);
  if (!h.state_label.empty()) line(h.state_label, h.chunks > 0 ? format_bytes(h.state_bytes) : "-", kText);
  bank_lines(h, line);
  // Flags, then the status (or the hint).
  int fx = a.x;
  const auto flag = [&](const std::string& t, SDL_Color c) { fx = font.draw(fx, y, t, c, 2) + font.advance(2); };
  if (h.recording) flag("REC " + fmt("%.0fs", h.record_s), kWarn);
  if (h.paused) flag("PAUSED", kRetrieved);
  if (h.show_gt) flag("GT", kRecent);
  if (h.mouse) flag(h.captured ? "mouse: Esc frees" : "click: capture", kDim);
  y += lh;
  font.draw(a.x, y, h.status.empty() ? "H: help" : h.status, h.status.empty() ? kDim : kAccent, 2);
}

void draw_region_bar(SDL_Renderer* r, const Font& font, const SDL_Rect& a, const MemorySnapshot* mem) {
  using namespace palette;
  if (!mem) {
    font.draw(a.x, a.y, "window: waiting for the first chunk", kDim, 2);
    return;
  }
  // Slots: every chunk in the window, plus the retrieved region's empty slots.
  struct Slot {
    std::string label;
    SDL_Color color;
    bool empty;
  };
  struct Group {
    std::string name;
    std::vector<Slot> slots;
  };
  std::vector<Group> groups;
  size_t total = 0;
  for (const auto& [name, ids] : mem->window) {
    Group g{name, {}};
    const SDL_Color c = region_color(name.c_str());
    for (const auto& id : ids) {
      const int64_t k = chunk_number(id);
      g.slots.push_back({k >= 0 ? std::to_string(k) : id, c, false});
    }
    if (name == "retrieved")
      for (int i = static_cast<int>(ids.size()); i < mem->retrieved_capacity; ++i) g.slots.push_back({"", c, true});
    if (g.slots.empty()) g.slots.push_back({"", c, true});  // an empty region still shows its place
    total += g.slots.size();
    groups.push_back(std::move(g));
  }
  const int gap = 6, group_gap = 18;
  const int top = a.y + font.line_height(2) + 4, box_h = a.h - (top - a.y);
  const int avail = a.w - static_cast<int>(groups.size()) * group_gap;
  const int box_w = std::clamp(static_cast<int>(total ? avail / static_cast<int>(total) : 60) - gap, 14, 56);
  const size_t max_boxes = static_cast<size_t>(std::max(1, avail / (box_w + gap)));
  // A window longer than the bar (full_kv) shows its first and last chunks of the long region.
  int x = a.x;
  for (auto& g : groups) {
    if (total > max_boxes && g.slots.size() > 8) {
      const size_t keep = std::max<size_t>(4, g.slots.size() - (total - max_boxes) - 1);
      const size_t cut = g.slots.size() - keep;
      std::vector<Slot> s(g.slots.begin(), g.slots.begin() + 2);
      s.push_back({"+" + std::to_string(cut), kDim, true});
      s.insert(s.end(), g.slots.end() - static_cast<long>(keep - 2), g.slots.end());
      g.slots = std::move(s);
    }
    const int gx = x;
    for (const auto& slot : g.slots) {
      const SDL_Rect box{x, top, box_w, box_h};
      if (slot.empty) {
        outline(r, box, slot.color);
      } else {
        fill(r, box, SDL_Color{static_cast<Uint8>(slot.color.r / 3), static_cast<Uint8>(slot.color.g / 3),
                               static_cast<Uint8>(slot.color.b / 3), 255});
        outline(r, box, slot.color);
      }
      if (!slot.label.empty()) {
        const int sc = font.width(slot.label, 2) <= box_w - 4 ? 2 : 1;
        font.draw(x + (box_w - font.width(slot.label, sc)) / 2, top + (box_h - font.line_height(sc)) / 2, slot.label,
                  slot.empty ? kDim : kText, sc);
      }
      x += box_w + gap;
    }
    // Caption over the group, in its colour: smaller, or cut, when the group is narrow.
    const int gw = x - gap - gx;
    const int cs = font.width(g.name, 2) <= gw ? 2 : 1;
    const size_t fit = static_cast<size_t>(std::max(1, gw / font.advance(cs)));
    font.draw(gx, a.y + font.line_height(2) - font.line_height(cs), g.name.substr(0, fit), region_color(g.name.c_str()), cs);
    x += group_gap - gap;
  }
}

void draw_latency_graph(SDL_Renderer* r, const Font& font, const SDL_Rect& a, const std::vector<double>& ms,
                        double budget_ms, const MemorySnapshot* mem) {
  using namespace palette;
  int y = a.y;
  // Retrieval line.
  if (mem && !mem->retrieved.empty()) {
    int x = font.draw(a.x, y, "retrieved:", kRetrieved, 2) + font.advance(2);
    for (size_t i = 0; i < mem->retrieved.size() && x < a.x + a.w - 60; ++i) {
      const int64_t k = chunk_number(mem->retrieved[i]);
      x = font.draw(x, y, k >= 0 ? std::to_string(k) : mem->retrieved[i], kText, 2);
      if (i < mem->retrieved_distance.size())
        x = font.draw(x + 2, y + font.line_height(2) - font.line_height(1), fmt("(%.2f)", mem->retrieved_distance[i]), kDim, 1);
      x += font.advance(2);
    }
  } else {
    font.draw(a.x, y, mem && mem->retrieved_capacity > 0 ? "retrieved: none yet (bank empty)" : "retrieved: - (no retrieval)",
              kDim, 2);
  }
  y += font.line_height(2) + 8;
  // Latency bars, newest on the right.
  const int gy = y + font.line_height(1) + 4;
  const SDL_Rect g{a.x, gy, a.w, a.y + a.h - gy};
  if (g.h < 24) return;
  double top = budget_ms * 1.5;
  for (double v : ms) top = std::max(top, v);
  top = std::max(top, 1.0);
  font.draw(a.x, y, fmt("chunk latency, last %.0f chunks", static_cast<double>(ms.size())) + "  (max " + format_ms(top) + ")",
            kDim, 1);
  set_color(r, SDL_Color{24, 26, 33, 255});
  SDL_RenderFillRect(r, &g);
  const int bw = 4, n = std::min<int>(static_cast<int>(ms.size()), g.w / bw);
  for (int i = 0; i < n; ++i) {
    const double v = ms[ms.size() - n + i];
    const int h = static_cast<int>(v / top * (g.h - 2));
    const SDL_Rect b{g.x + g.w - (n - i) * bw, g.y + g.h - h, bw - 1, h};
    set_color(r, budget_ms > 0 && v > budget_ms ? kRetrieved : kRecent);
    SDL_RenderFillRect(r, &b);
  }
  if (budget_ms > 0) {
    const int ly = g.y + g.h - static_cast<int>(budget_ms / top * (g.h - 2));
    set_color(r, kDim);
    for (int x = g.x; x < g.x + g.w; x += 6) SDL_RenderDrawLine(r, x, ly, x + 2, ly);
    font.draw(g.x + 4, ly - font.line_height(1) - 1, "real time " + format_ms(budget_ms), kDim, 1);
  }
}

void draw_help(SDL_Renderer* r, const Font& font, const SDL_Rect& a, const std::string& text) {
  using namespace palette;
  const int pad = 14;
  const int w = font.width(text, 2) + 2 * pad, h = font.height(text, 2) + 2 * pad + font.line_height(2) + 8;
  const SDL_Rect box{a.x + std::max(0, (a.w - w) / 2), a.y + std::max(0, (a.h - h) / 2), w, h};
  SDL_SetRenderDrawBlendMode(r, SDL_BLENDMODE_BLEND);
  fill(r, box, SDL_Color{10, 10, 14, 225});
  SDL_SetRenderDrawBlendMode(r, SDL_BLENDMODE_NONE);
  outline(r, box, kAccent);
  font.draw(box.x + pad, box.y + pad, "KEYS", kAccent, 2);
  font.draw(box.x + pad, box.y + pad + font.line_height(2) + 8, text, kText, 2);
}

void draw_banner(SDL_Renderer* r, const Font& font, const SDL_Rect& a, const std::string& text, SDL_Color c) {
  const int pad = 10, w = font.width(text, 4) + 2 * pad, h = font.height(text, 4) + 2 * pad;
  const SDL_Rect box{a.x + (a.w - w) / 2, a.y + (a.h - h) / 2, w, h};
  SDL_SetRenderDrawBlendMode(r, SDL_BLENDMODE_BLEND);
  fill(r, box, SDL_Color{0, 0, 0, 170});
  SDL_SetRenderDrawBlendMode(r, SDL_BLENDMODE_NONE);
  font.draw(box.x + pad, box.y + pad, text, c, 4);
}

}  // namespace wm::viewer
