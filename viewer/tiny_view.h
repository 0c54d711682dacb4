#pragma once
// The tiny DiT in the viewer: the procedural world it was trained on (a scene per seed, walls
// the camera cannot pass), W/A/S/D and the mouse or arrows as its actions, each frame's pose
// integrated against the walls (tools/world/actions.h) and handed to the model in its terms
// (tools/rollout/world_adapter.h); a rollout starts from the ground-truth view of its first chunk
// (the raycaster), which G also shows beside the model's frame; N is the next scene; the panel is
// the minimap (viewer/minimap.h).
#include <memory>
#include <string>
#include <vector>

#include "tools/world/actions.h"
#include "tools/world/pose.h"
#include "tools/world/raycaster.h"
#include "tools/world/scene.h"
#include "viewer/input.h"
#include "viewer/minimap.h"
#include "viewer/model_view.h"
#include "viewer/options.h"

namespace wm::viewer {

class TinyView final : public ModelView {
 public:
  explicit TinyView(const ViewerOptions& o);

  std::unique_ptr<worldkv::WorldSession> load() override;
  const ViewSetup& setup() const override { return setup_; }
  void open(SDL_Renderer* r, uint64_t seed) override;
  bool press(SDL_Scancode key) override;
  bool release(SDL_Scancode key) override;
  void mouse_motion(double dx, double dy) override;
  void clear_input() override { input_.clear(); }
  worldkv::FrameControl sample() override;
  std::vector<Image> prompt(const std::vector<worldkv::FrameControl>& first) override;
  bool accepts_policy(const std::string& policy) const override { return policy != "native"; }
  std::string new_start(uint64_t& seed) override;
  bool restart(bool new_start, const worldkv::Pose* last) override;
  worldkv::Pose start_pose() const override;
  bool reference(const worldkv::Pose& pose, Image& out) override;
  std::vector<HudLine> model_lines() const override;
  std::vector<HudLine> input_lines(const worldkv::FrameControl* shown) const override;
  void draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                  const MemorySnapshot* mem, const worldkv::Pose& pose) const override;
  std::string help_keys() const override;
  std::vector<bool> keys_on(const worldkv::FrameControl& control) const override;

 private:
  void new_scene(uint64_t seed);

  ViewerOptions o_;
  ViewSetup setup_;
  double fov_deg_ = 90;
  SDL_Renderer* renderer_ = nullptr;
  uint64_t seed_ = 0;
  std::unique_ptr<world::Scene> scene_;
  std::unique_ptr<world::Raycaster> raycaster_;
  Minimap minimap_;
  world::MotionParams motion_;
  world::Pose start_;  // the scene's start
  world::Pose pose_;   // after the last frame sampled
  InputState input_;
};

// A start pose for a scene: the centre of the free cell with the longest free run ahead along
// one of the four axes (the one nearest the map's centre among equals), facing along it.
world::Pose start_pose(const world::Scene& scene);

// The model path to use: `path` if given; else the embedded model
// assets/models/tiny/model.safetensors (relative to the working directory, then to the source
// tree). Throws wm::Error saying where it looked and how to get one.
std::string resolve_model_path(const std::string& path);

}  // namespace wm::viewer
