#include "tools/world/scene.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "runtime/error.h"
#include "tools/world/rng.h"

namespace wm::world {
namespace {

struct Rect {
  int x, y, w, h;
  int cx() const { return x + w / 2; }
  int cy() const { return y + h / 2; }
};

struct Grid {
  int W, H;
  std::vector<uint8_t> solid;
  std::vector<int16_t> zone;
  Grid(int w, int h) : W(w), H(h), solid(static_cast<size_t>(w) * h, 1), zone(static_cast<size_t>(w) * h, -1) {}
  size_t idx(int x, int y) const { return static_cast<size_t>(y) * W + x; }
  bool inside(int x, int y) const { return x >= 1 && y >= 1 && x < W - 1 && y < H - 1; }
  void carve(int x, int y, int z, bool keep_zone) {
    if (!inside(x, y)) return;
    size_t i = idx(x, y);
    if (solid[i] || !keep_zone) zone[i] = static_cast<int16_t>(z);
    solid[i] = 0;
  }
};

void carve_corridor(Grid& g, Rng& rng, int x0, int y0, int x1, int y1, int zone) {
  int width = rng.chance(0.25) ? 2 : 1;
  bool horizontal_first = rng.chance(0.5);
  auto carve_w = [&](int x, int y) {
    for (int a = 0; a < width; ++a)
      for (int b = 0; b < width; ++b) g.carve(x + a, y + b, zone, true);
  };
  int x = x0, y = y0;
  auto step_x = [&] { while (x != x1) { carve_w(x, y); x += x1 > x ? 1 : -1; } };
  auto step_y = [&] { while (y != y1) { carve_w(x, y); y += y1 > y ? 1 : -1; } };
  if (horizontal_first) { step_x(); step_y(); } else { step_y(); step_x(); }
  carve_w(x, y);
}

void layout_rooms(Grid& g, Rng& rng, const WorldParams& p) {
  std::vector<Rect> rooms;
  for (int attempt = 0; attempt < 400 && static_cast<int>(rooms.size()) < p.rooms; ++attempt) {
    int w = rng.uniform_int(p.room_min, p.room_max), h = rng.uniform_int(p.room_min, p.room_max);
    if (w > g.W - 2 || h > g.H - 2) continue;
    Rect r{rng.uniform_int(1, g.W - 1 - w), rng.uniform_int(1, g.H - 1 - h), w, h};
    bool overlap = false;
    for (const Rect& o : rooms)
      if (r.x <= o.x + o.w && o.x <= r.x + r.w && r.y <= o.y + o.h && o.y <= r.y + r.h) overlap = true;
    if (overlap) continue;
    rooms.push_back(r);
  }
  if (rooms.empty()) rooms.push_back({1, 1, std::min(g.W - 2, p.room_max), std::min(g.H - 2, p.room_max)});
  for (size_t i = 0; i < rooms.size(); ++i)
    for (int y = rooms[i].y; y < rooms[i].y + rooms[i].h; ++y)
      for (int x = rooms[i].x; x < rooms[i].x + rooms[i].w; ++x) g.carve(x, y, static_cast<int>(i) + 1, false);
  // Each corridor gets its own zone (and so its own look, drawn from the scene's materials).
  int corridor_zone = static_cast<int>(rooms.size()) + 1;
  // Spanning connections: each room to its nearest earlier room.
  for (size_t i = 1; i < rooms.size(); ++i) {
    size_t best = 0;
    int bd = 1 << 30;
    for (size_t j = 0; j < i; ++j) {
      int d = std::abs(rooms[i].cx() - rooms[j].cx()) + std::abs(rooms[i].cy() - rooms[j].cy());
      if (d < bd) { bd = d; best = j; }
    }
    carve_corridor(g, rng, rooms[i].cx(), rooms[i].cy(), rooms[best].cx(), rooms[best].cy(), corridor_zone++);
  }
  // Extra links make loops.
  for (size_t i = 0; i < rooms.size() && rooms.size() > 2; ++i) {
    if (!rng.chance(p.extra_links)) continue;
    size_t j = static_cast<size_t>(rng.uniform_int(0, static_cast<int>(rooms.size()) - 1));
    if (j == i) continue;
    carve_corridor(g, rng, rooms[i].cx(), rooms[i].cy(), rooms[j].cx(), rooms[j].cy(), corridor_zone++);
  }
  // Pillars inside large rooms, each with a free ring round it (so connectivity is kept and the
  // camera can walk round the block).
  for (const Rect& r : rooms) {
    if (r.w < 5 || r.h < 5 || !rng.chance(p.pillars)) continue;
    int tries = std::max(1, (r.w - 2) * (r.h - 2) / 8);
    for (int t = 0; t < tries; ++t) {
      int pw = rng.uniform_int(1, std::min(3, r.w - 4)), ph = rng.uniform_int(1, std::min(3, r.h - 4));
      int px = rng.uniform_int(r.x + 2, r.x + r.w - 2 - pw), py = rng.uniform_int(r.y + 2, r.y + r.h - 2 - ph);
      bool ok = true;
      for (int y = py - 1; y <= py + ph && ok; ++y)
        for (int x = px - 1; x <= px + pw && ok; ++x)
          if (!g.inside(x, y) || g.solid[g.idx(x, y)]) ok = false;
      if (!ok) continue;
      for (int y = py; y < py + ph; ++y)
        for (int x = px; x < px + pw; ++x) {
          g.solid[g.idx(x, y)] = 1;
          g.zone[g.idx(x, y)] = -1;
        }
    }
  }
}

void layout_blocks(Grid& g, Rng& rng, const WorldParams& p) {
  // Streets on a jittered lattice; the solid blocks between them.
  auto cuts = [&](int size) {
    std::vector<int> c{1};
    while (true) {
      int next = c.back() + 1 + rng.uniform_int(p.block_min, p.block_max);
      if (next > size - 2) break;
      c.push_back(next);
    }
    if (c.back() != size - 2) c.push_back(size - 2);  // last street hugs the border
    return c;
  };
  std::vector<int> xs = cuts(g.W), ys = cuts(g.H);
  for (int y = 1; y < g.H - 1; ++y)
    for (int x = 1; x < g.W - 1; ++x) {
      bool street = std::find(xs.begin(), xs.end(), x) != xs.end() || std::find(ys.begin(), ys.end(), y) != ys.end();
      if (street) g.carve(x, y, 0, false);
    }
  // Remove some blocks (plazas), widen some streets.
  for (size_t by = 0; by + 1 < ys.size(); ++by)
    for (size_t bx = 0; bx + 1 < xs.size(); ++bx) {
      if (!rng.chance(p.pillars * 0.4)) continue;
      for (int y = ys[by] + 1; y < ys[by + 1]; ++y)
        for (int x = xs[bx] + 1; x < xs[bx + 1]; ++x) g.carve(x, y, 0, false);
    }
  // Zones: districts as Voronoi cells of a few random sites.
  int sites = rng.uniform_int(2, 5);
  std::vector<std::pair<int, int>> s;
  for (int i = 0; i < sites; ++i) s.push_back({rng.uniform_int(1, g.W - 2), rng.uniform_int(1, g.H - 2)});
  for (int y = 0; y < g.H; ++y)
    for (int x = 0; x < g.W; ++x) {
      if (g.solid[g.idx(x, y)]) continue;
      int best = 0, bd = 1 << 30;
      for (int i = 0; i < sites; ++i) {
        int d = (x - s[i].first) * (x - s[i].first) + (y - s[i].second) * (y - s[i].second);
        if (d < bd) { bd = d; best = i; }
      }
      g.zone[g.idx(x, y)] = static_cast<int16_t>(best);
    }
}

// Keeps only the largest 4-connected free region.
void keep_largest_region(Grid& g) {
  std::vector<int> label(g.solid.size(), -1);
  int best = -1;
  size_t best_size = 0;
  int next = 0;
  for (int y = 0; y < g.H; ++y)
    for (int x = 0; x < g.W; ++x) {
      if (g.solid[g.idx(x, y)] || label[g.idx(x, y)] >= 0) continue;
      size_t size = 0;
      std::deque<std::pair<int, int>> q{{x, y}};
      label[g.idx(x, y)] = next;
      while (!q.empty()) {
        auto [cx, cy] = q.front();
        q.pop_front();
        ++size;
        const int d[4][2] = {{1, 0}, {-1, 0}, {0, 1}, {0, -1}};
        for (auto& o : d) {
          int nx = cx + o[0], ny = cy + o[1];
          if (nx < 0 || ny < 0 || nx >= g.W || ny >= g.H) continue;
          size_t ni = g.idx(nx, ny);
          if (g.solid[ni] || label[ni] >= 0) continue;
          label[ni] = next;
          q.push_back({nx, ny});
        }
      }
      if (size > best_size) { best_size = size; best = next; }
      ++next;
    }
  for (size_t i = 0; i < g.solid.size(); ++i)
    if (!g.solid[i] && label[i] != best) {
      g.solid[i] = 1;
      g.zone[i] = -1;
    }
}

}  // namespace

void validate(const WorldParams& p) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    throw wm::Error("WorldParams." + field + ": expected " + expected + ", got " + got);
  };
  if (p.layout != "rooms" && p.layout != "blocks") bad("layout", "\"rooms\" or \"blocks\"", "\"" + p.layout + "\"");
  if (p.width < 8 || p.width > 128) bad("width", "8..128", std::to_string(p.width));
  if (p.height < 8 || p.height > 128) bad("height", "8..128", std::to_string(p.height));
  if (p.rooms < 1 || p.rooms > 64) bad("rooms", "1..64", std::to_string(p.rooms));
  if (p.room_min < 2 || p.room_max < p.room_min || p.room_max > 32)
    bad("room_min/room_max", "2 <= room_min <= room_max <= 32", std::to_string(p.room_min) + "/" + std::to_string(p.room_max));
  if (p.block_min < 1 || p.block_max < p.block_min || p.block_max > 16)
    bad("block_min/block_max", "1 <= block_min <= block_max <= 16", std::to_string(p.block_min) + "/" + std::to_string(p.block_max));
  if (!(p.pillars >= 0 && p.pillars <= 1)) bad("pillars", "0..1", std::to_string(p.pillars));
  if (!(p.extra_links >= 0 && p.extra_links <= 1)) bad("extra_links", "0..1", std::to_string(p.extra_links));
  if (p.landmarks < 0 || p.landmarks > 32) bad("landmarks", "0..32", std::to_string(p.landmarks));
}

WorldParams random_world_params(uint64_t seed) {
  Rng rng(hash_combine(seed, 0x5EED));
  WorldParams p;
  p.seed = seed;
  int style = rng.uniform_int(0, 3);  // 0,1: rooms; 2: halls (few large pillared rooms); 3: blocks
  p.width = rng.uniform_int(16, 32);
  p.height = rng.uniform_int(16, 32);
  p.landmarks = rng.uniform_int(5, 12);
  if (style <= 1) {
    p.layout = "rooms";
    p.rooms = rng.uniform_int(4, 9);
    p.room_min = 3;
    p.room_max = rng.uniform_int(5, 9);
    p.pillars = rng.uniform(0.3, 0.9);
    p.extra_links = rng.uniform(0.2, 0.6);
  } else if (style == 2) {
    p.layout = "rooms";
    p.rooms = rng.uniform_int(2, 4);
    p.room_min = 6;
    p.room_max = rng.uniform_int(9, 13);
    p.pillars = 1.0;
    p.extra_links = rng.uniform(0.3, 0.8);
  } else {
    p.layout = "blocks";
    p.block_min = rng.uniform_int(1, 3);
    p.block_max = p.block_min + rng.uniform_int(0, 2);
    p.pillars = rng.uniform(0.0, 0.6);
  }
  auto r2 = [](double v) { return std::round(v * 100.0) / 100.0; };  // short, exact-looking JSON
  p.pillars = r2(p.pillars);
  p.extra_links = r2(p.extra_links);
  return p;
}

std::vector<std::pair<int, int>> Scene::free_cells() const {
  std::vector<std::pair<int, int>> out;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      if (!is_solid(x, y)) out.push_back({x, y});
  return out;
}

int Scene::landmark_count() const {
  int n = 0;
  for (int16_t l : landmark) n += l >= 0;
  return n;
}

std::string Scene::ascii() const {
  std::string s;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      size_t i = static_cast<size_t>(y) * width + x;
      s += landmark[i] >= 0 ? 'L' : solid[i] ? '#' : '.';
    }
    s += '\n';
  }
  return s;
}

Scene generate_scene(const WorldParams& params) {
  validate(params);
  Rng rng(hash_combine(params.seed, 0xC0FFEE));
  Grid g(params.width, params.height);
  if (params.layout == "blocks") layout_blocks(g, rng, params);
  else layout_rooms(g, rng, params);
  keep_largest_region(g);

  Scene s;
  s.params = params;
  s.width = g.W;
  s.height = g.H;
  s.solid = g.solid;
  s.zone = g.zone;
  s.landmark.assign(g.solid.size(), -1);

  // Appearance.
  Rng look(hash_combine(params.seed, 0xA11CE));
  double hue = look.uniform(0, 360);
  int n_wall = look.uniform_int(3, 5), n_floor = look.uniform_int(2, 3), n_ceil = look.uniform_int(1, 2);
  for (int i = 0; i < n_wall; ++i) s.textures.push_back(make_wall_texture(look, hue + look.uniform(-60, 60)));
  for (int i = 0; i < n_floor; ++i) s.textures.push_back(make_floor_texture(look, hue));
  for (int i = 0; i < n_ceil; ++i) s.textures.push_back(make_ceiling_texture(look, hue));
  int max_zone = 0;
  for (int16_t z : s.zone) max_zone = std::max<int>(max_zone, z);
  for (int z = 0; z <= max_zone; ++z) {
    Material m;
    m.wall = look.uniform_int(0, n_wall - 1);
    m.floor = n_wall + look.uniform_int(0, n_floor - 1);
    m.ceiling = n_wall + n_floor + look.uniform_int(0, n_ceil - 1);
    s.zone_material.push_back(m);
  }
  double fog_v = look.uniform(0.0, 0.5);
  s.fog = hsv(hue + look.uniform(-60, 60), look.uniform(0.0, 0.5), fog_v);
  s.fog_density = look.uniform(0.06, 0.22);
  s.side_shade = look.uniform(0.6, 0.85);
  s.floor_shade.resize(g.solid.size());
  double shade_amp = look.uniform(0.05, 0.2);
  for (auto& f : s.floor_shade) f = static_cast<uint8_t>(std::lround(128 * (1.0 + look.uniform(-shade_amp, shade_amp))));

  // Landmarks: wall cells that face free space, spread apart, each with its own shape.
  std::vector<std::pair<int, int>> candidates;
  for (int y = 1; y < s.height - 1; ++y)
    for (int x = 1; x < s.width - 1; ++x) {
      if (!s.is_solid(x, y)) continue;
      if (!s.is_solid(x + 1, y) || !s.is_solid(x - 1, y) || !s.is_solid(x, y + 1) || !s.is_solid(x, y - 1))
        candidates.push_back({x, y});
    }
  // Border cells can face the inside too.
  for (int y = 0; y < s.height; ++y)
    for (int x = 0; x < s.width; ++x) {
      if (x > 0 && y > 0 && x < s.width - 1 && y < s.height - 1) continue;
      bool faces = (x + 1 < s.width && !s.is_solid(x + 1, y)) || (x > 0 && !s.is_solid(x - 1, y)) ||
                   (y + 1 < s.height && !s.is_solid(x, y + 1)) || (y > 0 && !s.is_solid(x, y - 1));
      if (faces) candidates.push_back({x, y});
    }
  int shape_offset = look.uniform_int(0, 9);
  std::vector<std::pair<int, int>> chosen;
  for (int i = 0; i < params.landmarks && !candidates.empty(); ++i) {
    for (int t = 0; t < 50; ++t) {
      auto c = candidates[static_cast<size_t>(look.uniform_int(0, static_cast<int>(candidates.size()) - 1))];
      bool far = true;
      for (auto& o : chosen)
        if (std::abs(o.first - c.first) + std::abs(o.second - c.second) < 4) far = false;
      if (!far && t < 49) continue;
      if (!far) break;
      chosen.push_back(c);
      s.landmark[static_cast<size_t>(c.second) * s.width + c.first] = static_cast<int16_t>(s.textures.size());
      s.textures.push_back(make_landmark_texture(look, shape_offset + i));
      break;
    }
  }
  return s;
}

}  // namespace wm::world
