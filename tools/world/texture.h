#pragma once
// Procedural square RGB textures for walls, floors, ceilings and landmark tiles.
#include <cstdint>
#include <string>
#include <vector>

#include "tools/world/rng.h"

namespace wm::world {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

// Colour from hue (degrees), saturation and value in [0, 1].
Rgb hsv(double hue_deg, double sat, double val);

// A square RGB8 texture, sampled with wrap-around.
struct Texture {
  static constexpr int kSize = 32;  // texels per side; one texture tile spans one map cell
  std::string kind;                 // what drew it ("bricks", "stripes", "landmark:ring", ...)
  std::vector<uint8_t> rgb = std::vector<uint8_t>(kSize * kSize * 3);  // [v][u][3]

  uint8_t* at(int u, int v) { return rgb.data() + (v * kSize + u) * 3; }
  const uint8_t* at(int u, int v) const { return rgb.data() + (v * kSize + u) * 3; }
};

// A wall texture of a random kind (bricks, stripes, panels, checker, blotches, wainscot ...).
Texture make_wall_texture(Rng& rng, double base_hue);
// A floor texture of a random kind (tiles, checker, planks, blotches, grid ...).
Texture make_floor_texture(Rng& rng, double base_hue);
// A ceiling texture of a random kind (light panels, beams, plain blotches ...).
Texture make_ceiling_texture(Rng& rng, double base_hue);
// A high-contrast landmark tile; `index` picks the shape so a scene's landmarks differ.
Texture make_landmark_texture(Rng& rng, int index);

}  // namespace wm::world
