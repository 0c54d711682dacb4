#pragma once
// A procedural grid world: rooms, corridors, city blocks and pillars on a cell map, with
// appearance (wall, floor, ceiling textures, landmark tiles, fog) drawn at random per scene.
// Everything follows from WorldParams (which holds the seed): the same params give the same scene.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tools/world/texture.h"

namespace wm::world {

// What to generate; stored in scene-trajectory JSON so a scene can be rebuilt exactly.
struct WorldParams {
  uint64_t seed = 0;
  std::string layout = "rooms";  // "rooms": rooms + corridors + pillars; "blocks": streets round city blocks
  int width = 24;                // map size in cells, border included (8..128)
  int height = 24;
  int rooms = 6;                 // rooms layout: how many rooms to try to place
  int room_min = 3;              // rooms layout: room side range in cells
  int room_max = 7;
  int block_min = 2;             // blocks layout: block side range in cells
  int block_max = 4;
  double pillars = 0.5;          // chance per large room of pillar blocks; blocks layout: chance a block is removed
  double extra_links = 0.4;      // rooms layout: chance per room of an extra corridor (makes loops)
  int landmarks = 6;             // landmark wall tiles, each with its own shape/colour (0..32)
};

// Validates ranges; throws wm::Error naming the field, expected and got.
void validate(const WorldParams& p);

// Diverse world params drawn from a seed (layout, size, room counts, pillars, landmarks).
WorldParams random_world_params(uint64_t seed);

// Per-zone look: indices into Scene::textures.
struct Material {
  int wall = 0;
  int floor = 0;
  int ceiling = 0;
};

struct Scene {
  WorldParams params;
  int width = 0, height = 0;
  std::vector<uint8_t> solid;      // [height][width]; 1 = wall
  std::vector<int16_t> zone;       // [height][width]; zone of a free cell (room id), -1 for walls
  std::vector<int16_t> landmark;   // [height][width]; texture index of a landmark wall cell, else -1
  std::vector<uint8_t> floor_shade;  // [height][width]; per-cell floor brightness, 128 = 1x
  std::vector<Material> zone_material;  // by zone id
  std::vector<Texture> textures;
  Rgb fog;                          // colour far things fade to
  double fog_density = 0.1;         // per cell of distance
  double side_shade = 0.75;         // brightness of y-facing wall faces relative to x-facing ones

  // True for walls and everything outside the map.
  bool is_solid(int cx, int cy) const {
    return cx < 0 || cy < 0 || cx >= width || cy >= height || solid[static_cast<size_t>(cy) * width + cx] != 0;
  }
  // Free (walkable) cells, row-major order.
  std::vector<std::pair<int, int>> free_cells() const;
  // Number of landmark wall cells.
  int landmark_count() const;
  // ASCII map ('#' wall, '.' free, 'L' landmark) for debugging and tests.
  std::string ascii() const;
};

// Builds the scene for these params (deterministic). Throws wm::Error on bad params.
Scene generate_scene(const WorldParams& params);

}  // namespace wm::world
