#pragma once
// Matrix-Game-2.0 in the viewer: the keys and the mouse as the model's mode reads them
// (viewer/mg2_input.h), one worldkv::Mg2Input per video frame, 9 for the first chunk and 12 for
// each later one; the rollout starts from the first frame's condition (--image, encoded with the
// Wan VAE and CLIP, or --latents) and every chunk is decoded by the VAE; its retrieval pose is
// the session's (W/S/A/D and the mouse accumulated); N and the policy keys restart from the
// first frame, 0 on upstream's own rolling window; the panel is the pose's track from above
// (viewer/mg2_hud.h).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "viewer/mg2_input.h"
#include "viewer/model_view.h"
#include "viewer/options.h"

namespace wm::viewer {

class Mg2View final : public ModelView {
 public:
  // The mode is --mode until load() reads the model's (the help's keys before then).
  explicit Mg2View(const ViewerOptions& o);

  std::unique_ptr<worldkv::WorldSession> load() override;
  const ViewSetup& setup() const override { return setup_; }
  void open(SDL_Renderer* r, uint64_t seed) override;
  bool press(SDL_Scancode key) override;
  bool release(SDL_Scancode key) override;
  void mouse_motion(double dx, double dy) override { input_->mouse_motion(dx, dy); }
  void clear_input() override { input_->clear(); }
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
  void set_mode(const std::string& mode);

  ViewerOptions o_;
  ViewSetup setup_;
  std::string mode_;
  std::unique_ptr<Mg2InputState> input_;
};

// The key a scancode stands for in `mode` (Space, Q and E only in templerun, where Q does not quit).
std::optional<Mg2Key> mg2_key(SDL_Scancode sc, const std::string& mode);

// True when the options name a Matrix-Game-2.0 model: `mode` given, `model_path` a folder, or
// a file with a config.json beside it whose _class_name is CausalWanModel.
bool is_mg2_model(const std::string& model_path, const std::string& mode);

}  // namespace wm::viewer
