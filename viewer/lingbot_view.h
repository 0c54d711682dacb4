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
#include <vector>

#include "viewer/mg2_keys_view.h"
#include "viewer/options.h"
#include "worldkv/pose.h"

namespace wm::viewer {

// Pose units a video frame of W/S/A/D moves the camera (the translation is normalised, so only
// the ratio of steps matters).
inline constexpr double kLingbotStep = 1.0;

class LingbotView final : public Mg2KeysView {
 public:
  explicit LingbotView(const ViewerOptions& o);

  std::unique_ptr<worldkv::WorldSession> load() override;
  // The held input, and the camera pose it moves to as the control's `pose`.
  worldkv::FrameControl sample() override;
  // Back to the image, the camera at the origin.
  bool restart(bool new_start, const worldkv::Pose* last) override;
  std::vector<HudLine> model_lines() const override;

 private:
  worldkv::Pose pose_;  // the camera after the last frame sampled
};

}  // namespace wm::viewer
