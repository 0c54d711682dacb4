#pragma once
// LingBot-World-Fast in the viewer: the keys and the mouse as Matrix-Game-2.0's universal mode
// reads them (viewer/mg2_input.h: W S A D, the mouse or the arrows turning), integrated into the
// camera pose of every video frame (worldkv::mg2_integrate_pose: a step of `kLingbotStep` a frame
// along the yaw, the mouse's pitch and yaw in radians), which is the model's control and its
// retrieval pose; 9 frames for the first chunk, 12 for each later one. The rollout starts from
// --image (resized and encoded with the Wan VAE as upstream does, at the video size --size gives)
// with --prompt through umT5 (encoded once, before the DiT loads) or --text-context (or zero
// rows); the camera is the live path (worldkv/lingbot_adapter.h):
// translations divided by the longest step the keys can make between latent frames, so a walk at
// full speed is upstream's input exactly. N and the policy keys restart from the image; the panel
// is the pose's track from above (viewer/mg2_hud.h).
#include <memory>
#include <string>
#include <vector>

#include "viewer/mg2_input.h"
#include "viewer/model_view.h"
#include "viewer/options.h"

namespace wm::viewer {

// Pose units a video frame of W/S/A/D moves the camera (the translation is normalised, so only
// the ratio of steps matters).
inline constexpr double kLingbotStep = 1.0;

class LingbotView final : public ModelView {
 public:
  explicit LingbotView(const ViewerOptions& o);

  std::unique_ptr<worldkv::WorldSession> load() override;
  const ViewSetup& setup() const override { return setup_; }
  void open(SDL_Renderer* r, uint64_t seed) override;
  bool press(SDL_Scancode key) override;
  bool release(SDL_Scancode key) override;
  void mouse_motion(double dx, double dy) override { input_.mouse_motion(dx, dy); }
  void clear_input() override { input_.clear(); }
  worldkv::FrameControl sample() override;
  std::vector<Image> prompt(const std::vector<worldkv::FrameControl>& first) override;
  bool accepts_policy(const std::string& policy) const override;
  std::string new_start(uint64_t& seed) override;
  bool restart(bool new_start, const worldkv::Pose* last) override;
  worldkv::Pose start_pose() const override { return worldkv::Pose{}; }
  bool reference(const worldkv::Pose& pose, Image& out) override;
  std::vector<HudLine> model_lines() const override;
  std::vector<HudLine> input_lines(const worldkv::FrameControl* shown) const override;
  void draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                  const MemorySnapshot* mem, const worldkv::Pose& pose) const override;
  std::string help_keys() const override;
  std::vector<bool> keys_on(const worldkv::FrameControl& control) const override;

 private:
  ViewerOptions o_;
  ViewSetup setup_;
  Mg2InputState input_{"universal"};
  worldkv::Pose pose_;  // the camera after the last frame sampled
};

}  // namespace wm::viewer
