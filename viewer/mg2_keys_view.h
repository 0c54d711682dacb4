#pragma once
// What Matrix-Game-2.0 (viewer/mg2_view.h) and LingBot-World-Fast (viewer/lingbot_view.h) do
// alike in the viewer: the keys and the mouse as a Matrix-Game-2.0 mode reads them
// (viewer/mg2_input.h, mg2_key below), one worldkv::Mg2Input per video frame; a rollout starts
// from the model's own condition (no prompt frames, no seed, no ground truth), N and the policy
// keys restart it from there at the origin pose, and a digit key may pick any policy but
// worldkv_attn; the HUD's input line, the help's keys and the keys counted are the mode's, and
// the panel is the pose's track from above (viewer/mg2_hud.h). A kind adds its load(), its HUD
// lines, and what it does besides on sample() and restart().
#include <SDL.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "viewer/mg2_hud.h"
#include "viewer/mg2_input.h"
#include "viewer/model_view.h"
#include "viewer/options.h"

namespace wm::viewer {

class Mg2KeysView : public ModelView {
 public:
  const ViewSetup& setup() const override { return setup_; }
  void open(SDL_Renderer*, uint64_t) override {}  // the model's condition is all a rollout starts from
  bool press(SDL_Scancode key) override;
  bool release(SDL_Scancode key) override;
  void mouse_motion(double dx, double dy) override { input_->mouse_motion(dx, dy); }
  void clear_input() override { input_->clear(); }
  // The held input's Mg2Input as the control's `mg2`.
  worldkv::FrameControl sample() override;
  std::vector<Image> prompt(const std::vector<worldkv::FrameControl>&) override { return {}; }
  bool accepts_policy(const std::string& policy) const override { return policy != "worldkv_attn"; }
  std::string new_start(uint64_t&) override { return setup_.new_start; }
  // Every rollout starts over, from the model's condition.
  bool restart(bool, const worldkv::Pose*) override { return false; }
  worldkv::Pose start_pose() const override { return worldkv::Pose{}; }
  bool reference(const worldkv::Pose&, Image&) override { return false; }  // no ground truth
  std::vector<HudLine> input_lines(const worldkv::FrameControl* shown) const override;
  void draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                  const MemorySnapshot* mem, const worldkv::Pose& pose) const override;
  std::string help_keys() const override { return mg2_help_keys(mode_); }
  std::vector<bool> keys_on(const worldkv::FrameControl& control) const override;

 protected:
  // Keys and mouse of `mode` (set_mode); the kind fills in the rest of setup_.
  Mg2KeysView(const ViewerOptions& o, const std::string& mode);
  // Reads the keys and the mouse as `mode` does from now on (setup_'s keys, whether the mouse
  // steers). Throws wm::Error for a mode the viewer cannot drive.
  void set_mode(const std::string& mode);

  ViewerOptions o_;
  ViewSetup setup_;
  std::string mode_;
  std::unique_ptr<Mg2InputState> input_;
};

// The key a scancode stands for in `mode` (Space, Q and E only in templerun, where Q does not quit).
std::optional<Mg2Key> mg2_key(SDL_Scancode sc, const std::string& mode);

}  // namespace wm::viewer
