#pragma once
// The minimap: the scene's grid map (a texture built once per scene), the trajectory so far,
// the poses of the chunks in the bank and the window (retrieved ones highlighted, with a line to
// the camera), and the camera with its heading and field of view.
#include <SDL.h>

#include <vector>

#include "tools/world/pose.h"
#include "tools/world/scene.h"
#include "viewer/font.h"
#include "viewer/generator.h"
#include "viewer/sdl_handles.h"

namespace wm::viewer {

class Minimap {
 public:
  // Builds the map texture of `scene` (one pixel per cell). Throws wm::Error on an SDL failure.
  void set_scene(SDL_Renderer* r, const world::Scene& scene);

  // Draws into `area` (the map is fitted, square cells, centred). trail: camera positions so
  // far; mem may be null; fov_deg: the camera's horizontal field of view.
  void draw(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<world::Pose>& trail,
            const MemorySnapshot* mem, const world::Pose& camera, double fov_deg) const;

 private:
  TexturePtr map_;
  int w_ = 0, h_ = 0;
};

}  // namespace wm::viewer
