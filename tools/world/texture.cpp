#include "tools/world/texture.h"

#include <algorithm>
#include <cmath>

namespace wm::world {
namespace {

constexpr int N = Texture::kSize;

uint8_t clamp8(double v) { return static_cast<uint8_t>(std::clamp(v, 0.0, 255.0) + 0.0); }

Rgb scale(Rgb c, double f) { return {clamp8(c.r * f), clamp8(c.g * f), clamp8(c.b * f)}; }

Rgb lerp(Rgb a, Rgb b, double t) {
  return {clamp8(a.r + (b.r - a.r) * t), clamp8(a.g + (b.g - a.g) * t), clamp8(a.b + (b.b - a.b) * t)};
}

void put(Texture& t, int u, int v, Rgb c) {
  uint8_t* p = t.at(u, v);
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

// Smooth periodic value noise on the texture torus; cells = lattice cells per side.
struct Noise {
  int cells;
  std::vector<double> lattice;
  Noise(Rng& rng, int c) : cells(c), lattice(static_cast<size_t>(c) * c) {
    for (auto& v : lattice) v = rng.uniform();
  }
  double operator()(double u, double v) const {  // u, v in texels
    double fu = u / N * cells, fv = v / N * cells;
    int iu = static_cast<int>(std::floor(fu)), iv = static_cast<int>(std::floor(fv));
    double tu = fu - iu, tv = fv - iv;
    tu = tu * tu * (3 - 2 * tu);
    tv = tv * tv * (3 - 2 * tv);
    auto L = [&](int a, int b) { return lattice[((b % cells + cells) % cells) * cells + (a % cells + cells) % cells]; };
    double a = L(iu, iv) + (L(iu + 1, iv) - L(iu, iv)) * tu;
    double b = L(iu, iv + 1) + (L(iu + 1, iv + 1) - L(iu, iv + 1)) * tu;
    return a + (b - a) * tv;
  }
};

// Two colours of a scheme around the scene's base hue.
void pick_pair(Rng& rng, double base_hue, Rgb& a, Rgb& b, double vmin = 0.35, double vmax = 0.9) {
  double h1 = base_hue + rng.uniform(-40, 40);
  double h2 = h1 + (rng.chance(0.5) ? rng.uniform(-30, 30) : 180 + rng.uniform(-30, 30));
  double s1 = rng.uniform(0.25, 0.85), s2 = rng.uniform(0.15, 0.8);
  double v1 = rng.uniform(vmin, vmax);
  double v2 = rng.chance(0.5) ? v1 * rng.uniform(0.45, 0.7) : std::min(1.0, v1 * rng.uniform(1.3, 1.8));
  a = hsv(h1, s1, v1);
  b = hsv(h2, s2, std::clamp(v2, 0.08, 1.0));
}

void fill_grain(Texture& t, Rng& rng, double amount) {  // per-texel brightness grain
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      uint8_t* p = t.at(u, v);
      double f = 1.0 + rng.uniform(-amount, amount);
      for (int k = 0; k < 3; ++k) p[k] = clamp8(p[k] * f);
    }
}

Texture bricks(Rng& rng, Rgb brick, Rgb mortar, const char* kind) {
  Texture t;
  t.kind = kind;
  int bh = rng.chance(0.5) ? 8 : 6 + 2 * rng.uniform_int(0, 2);  // brick height in texels
  if (N % bh != 0) bh = 8;
  int bw = rng.chance(0.6) ? 16 : 8 * rng.uniform_int(1, 4);
  int rows = N / bh;
  std::vector<double> jitter(rows * 8);
  for (auto& j : jitter) j = rng.uniform(0.8, 1.15);
  for (int v = 0; v < N; ++v) {
    int row = v / bh;
    int off = (row % 2) * bw / 2;
    for (int u = 0; u < N; ++u) {
      int uu = (u + off) % N;
      bool m = (v % bh == 0) || (uu % bw == 0);
      int col = uu / bw;
      put(t, u, v, m ? mortar : scale(brick, jitter[(row * 8 + col) % jitter.size()]));
    }
  }
  return t;
}

Texture stripes(Rng& rng, Rgb a, Rgb b, bool vertical) {
  Texture t;
  t.kind = vertical ? "stripes_v" : "stripes_h";
  int period = 4 << rng.uniform_int(1, 3);  // 8, 16, 32
  int duty = std::max(2, static_cast<int>(period * rng.uniform(0.25, 0.6)));
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      int c = vertical ? u : v;
      put(t, u, v, (c % period) < duty ? a : b);
    }
  return t;
}

Texture diagonal(Rng& rng, Rgb a, Rgb b) {
  Texture t;
  t.kind = "diagonal";
  int period = rng.chance(0.5) ? 16 : 32;
  bool flip = rng.chance(0.5);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      int c = flip ? (u + v) : (u - v + N);
      put(t, u, v, (c % period) < period / 2 ? a : b);
    }
  return t;
}

Texture checker(Rng& rng, Rgb a, Rgb b, const char* kind) {
  Texture t;
  t.kind = kind;
  int sq = rng.chance(0.5) ? 16 : 8;
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) put(t, u, v, ((u / sq + v / sq) % 2) ? a : b);
  return t;
}

Texture blotches(Rng& rng, Rgb a, Rgb b, const char* kind) {
  Texture t;
  t.kind = kind;
  Noise n1(rng, rng.chance(0.5) ? 4 : 8), n2(rng, 16);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      double x = 0.75 * n1(u, v) + 0.25 * n2(u, v);
      put(t, u, v, lerp(a, b, std::clamp((x - 0.3) * 2.5, 0.0, 1.0)));
    }
  return t;
}

Texture panels(Rng& rng, Rgb a, Rgb b) {
  Texture t;
  t.kind = "panels";
  int pw = rng.chance(0.5) ? 16 : 32, ph = rng.chance(0.5) ? 16 : 32;
  Rgb hi = scale(a, 1.3), lo = scale(a, 0.6);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      int pu = u % pw, pv = v % ph;
      Rgb c = a;
      if (pu < 2 || pv < 2) c = hi;
      else if (pu >= pw - 2 || pv >= ph - 2) c = lo;
      else if (pu >= 5 && pu < pw - 5 && pv >= 5 && pv < ph - 5) c = b;
      put(t, u, v, c);
    }
  return t;
}

Texture wainscot(Rng& rng, Rgb a, Rgb b) {
  Texture t;
  t.kind = "wainscot";
  int split = rng.uniform_int(14, 20);
  int period = rng.chance(0.5) ? 4 : 8;
  Rgb line = scale(b, 0.5);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      Rgb c;
      if (v < split) c = a;
      else if (v < split + 2) c = line;
      else c = (u % period == 0) ? scale(b, 0.75) : b;
      put(t, u, v, c);
    }
  return t;
}

Texture tiles(Rng& rng, Rgb a, Rgb b, const char* kind) {
  Texture t;
  t.kind = kind;
  int sq = rng.chance(0.6) ? 16 : 32;
  int grout = rng.uniform_int(1, 2);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) put(t, u, v, (u % sq < grout || v % sq < grout) ? b : a);
  return t;
}

Texture planks(Rng& rng, Rgb a, const char* kind) {
  Texture t;
  t.kind = kind;
  int w = rng.chance(0.5) ? 8 : 16;
  bool vertical = rng.chance(0.5);
  std::vector<double> shade(N / w + 1);
  for (auto& s : shade) s = rng.uniform(0.7, 1.2);
  Noise grain(rng, 16);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      int across = vertical ? u : v;
      int along = vertical ? v : u;
      bool seam = (across % w == 0) || (((along + (across / w) * 11) % N) == 0);
      double f = shade[across / w] * (0.85 + 0.3 * grain(vertical ? u * 0.25 : u * 4.0, vertical ? v * 4.0 : v * 0.25));
      put(t, u, v, seam ? scale(a, 0.45) : scale(a, f));
    }
  return t;
}

Texture light_panels(Rng& rng, Rgb a, const char* kind) {
  Texture t;
  t.kind = kind;
  Rgb light = lerp(a, Rgb{255, 250, 230}, rng.uniform(0.6, 0.9));
  int size = rng.uniform_int(8, 14);
  bool strip = rng.chance(0.4);
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      int du = std::abs(u - N / 2), dv = std::abs(v - N / 2);
      bool in = strip ? (dv < 3) : (du < size / 2 && dv < size / 2);
      bool rim = strip ? (dv == 3) : ((du == size / 2 && dv <= size / 2) || (dv == size / 2 && du <= size / 2));
      put(t, u, v, in ? light : rim ? scale(a, 0.6) : a);
    }
  return t;
}

}  // namespace

Rgb hsv(double h, double s, double v) {
  h = std::fmod(h, 360.0);
  if (h < 0) h += 360.0;
  double c = v * s, x = c * (1 - std::fabs(std::fmod(h / 60.0, 2.0) - 1)), m = v - c;
  double r = 0, g = 0, b = 0;
  int sector = static_cast<int>(h / 60.0) % 6;
  switch (sector) {
    case 0: r = c; g = x; break;
    case 1: r = x; g = c; break;
    case 2: g = c; b = x; break;
    case 3: g = x; b = c; break;
    case 4: r = x; b = c; break;
    default: r = c; b = x; break;
  }
  return {clamp8((r + m) * 255.0 + 0.5), clamp8((g + m) * 255.0 + 0.5), clamp8((b + m) * 255.0 + 0.5)};
}

Texture make_wall_texture(Rng& rng, double base_hue) {
  Rgb a, b;
  pick_pair(rng, base_hue, a, b);
  Texture t;
  switch (rng.uniform_int(0, 8)) {
    case 0: case 1: t = bricks(rng, a, b, "bricks"); break;
    case 2: t = stripes(rng, a, b, true); break;
    case 3: t = stripes(rng, a, b, false); break;
    case 4: t = panels(rng, a, b); break;
    case 5: t = checker(rng, a, b, "checker"); break;
    case 6: t = blotches(rng, a, b, "blotches"); break;
    case 7: t = wainscot(rng, a, b); break;
    default: t = diagonal(rng, a, b); break;
  }
  fill_grain(t, rng, 0.06);
  return t;
}

Texture make_floor_texture(Rng& rng, double base_hue) {
  Rgb a, b;
  pick_pair(rng, base_hue + 180 * rng.uniform_int(0, 1), a, b, 0.25, 0.75);
  Texture t;
  switch (rng.uniform_int(0, 4)) {
    case 0: t = tiles(rng, a, b, "floor_tiles"); break;
    case 1: t = checker(rng, a, b, "floor_checker"); break;
    case 2: t = planks(rng, a, "floor_planks"); break;
    case 3: t = blotches(rng, a, b, "floor_blotches"); break;
    default: t = tiles(rng, a, scale(a, 0.55), "floor_grid"); break;
  }
  fill_grain(t, rng, 0.08);
  return t;
}

Texture make_ceiling_texture(Rng& rng, double base_hue) {
  Rgb a, b;
  pick_pair(rng, base_hue + rng.uniform(-90, 90), a, b, 0.3, 0.8);
  Texture t;
  switch (rng.uniform_int(0, 3)) {
    case 0: case 1: t = light_panels(rng, a, "ceiling_lights"); break;
    case 2: t = stripes(rng, a, b, rng.chance(0.5)); t.kind = "ceiling_beams"; break;
    default: t = blotches(rng, a, b, "ceiling_blotches"); break;
  }
  fill_grain(t, rng, 0.04);
  return t;
}

Texture make_landmark_texture(Rng& rng, int index) {
  static const char* kShapes[] = {"disc", "ring", "plus", "cross", "triangle", "diamond", "bars", "target", "window", "arrow"};
  constexpr int kCount = sizeof(kShapes) / sizeof(kShapes[0]);
  int shape = ((index % kCount) + kCount) % kCount;
  double hue = rng.uniform(0, 360);
  Rgb fg = hsv(hue, rng.uniform(0.75, 1.0), rng.uniform(0.85, 1.0));
  Rgb bg = rng.chance(0.5) ? hsv(hue + 180 + rng.uniform(-40, 40), rng.uniform(0.2, 0.6), rng.uniform(0.1, 0.3))
                           : hsv(hue + rng.uniform(90, 270), rng.uniform(0.1, 0.3), rng.uniform(0.85, 1.0));
  Rgb frame = scale(bg, 0.5);
  Texture t;
  t.kind = std::string("landmark:") + kShapes[shape];
  for (int v = 0; v < N; ++v)
    for (int u = 0; u < N; ++u) {
      double x = (u + 0.5) / N * 2 - 1, y = (v + 0.5) / N * 2 - 1;  // [-1, 1]
      double r = std::hypot(x, y);
      bool on = false;
      switch (shape) {
        case 0: on = r < 0.6; break;
        case 1: on = r < 0.7 && r > 0.4; break;
        case 2: on = (std::fabs(x) < 0.2 || std::fabs(y) < 0.2) && std::fabs(x) < 0.75 && std::fabs(y) < 0.75; break;
        case 3: on = (std::fabs(x - y) < 0.28 || std::fabs(x + y) < 0.28) && r < 0.9; break;
        case 4: on = y < 0.6 && y > -0.7 && std::fabs(x) < (y + 0.7) * 0.55; break;
        case 5: on = std::fabs(x) + std::fabs(y) < 0.7; break;
        case 6: on = (static_cast<int>((x + 1) * 3.5) % 2 == 0) && std::fabs(y) < 0.75; break;
        case 7: on = (static_cast<int>(r * 5) % 2 == 0) && r < 0.9; break;
        case 8: on = std::fabs(x) < 0.7 && std::fabs(y) < 0.7 && std::fabs(x) > 0.08 && std::fabs(y) > 0.08; break;
        default: on = (std::fabs(y) < 0.18 && x > -0.7 && x < 0.2) || (x >= 0.1 && x < 0.75 && std::fabs(y) < (0.75 - x) * 0.9); break;
      }
      bool border = std::fabs(x) > 0.88 || std::fabs(y) > 0.88;
      put(t, u, v, border ? frame : on ? fg : bg);
    }
  return t;
}

}  // namespace wm::world
