#pragma once
// First-person grid raycaster (Wolfenstein style) for a Scene: textured walls by DDA, textured
// floor and ceiling by per-row floor casting, distance fog, face shading, optional pitch as a
// horizon shift. Pure C++; deterministic; safe to call from several threads at once.
#include "dit/image.h"
#include "tools/world/pose.h"
#include "tools/world/scene.h"

namespace wm::world {

struct RenderSpec {
  int width = 64;         // output pixels
  int height = 64;
  double fov_deg = 90.0;  // horizontal field of view
  int supersample = 2;    // s x s samples per output pixel, box-filtered (1 = off)
};

// Validates the spec; throws wm::Error naming the field, expected and got.
void validate(const RenderSpec& spec);

class Raycaster {
 public:
  // Keeps a reference to `scene`, which must outlive the raycaster.
  Raycaster(const Scene& scene, RenderSpec spec = {});

  // Renders the view from `pose` into `out` (resized to the spec's size when needed).
  void render(const Pose& pose, wm::Image& out) const;
  // Renders the view from `pose` into a new image.
  wm::Image render(const Pose& pose) const;

  const RenderSpec& spec() const { return spec_; }
  const Scene& scene() const { return scene_; }

 private:
  const Scene& scene_;
  RenderSpec spec_;
};

}  // namespace wm::world
