#pragma once
// Matrix-Game-2.0 in the viewer: the keys and the mouse as the model's mode reads them
// (viewer/mg2_input.h), one worldkv::Mg2Input per video frame, 9 for the first chunk and 12 for
// each later one; the rollout starts from the first frame's condition (--image, encoded with the
// Wan VAE and CLIP, or --latents) and every chunk is decoded by the VAE; its retrieval pose is
// the session's (W/S/A/D and the mouse accumulated); N and the policy keys restart from the
// first frame, 0 on upstream's own rolling window; the panel is the pose's track from above
// (viewer/mg2_hud.h).
#include <memory>
#include <string>
#include <vector>

#include "viewer/mg2_keys_view.h"
#include "viewer/options.h"

namespace wm::viewer {

class Mg2View final : public Mg2KeysView {
 public:
  // The mode is --mode until load() reads the model's (the help's keys before then).
  explicit Mg2View(const ViewerOptions& o);

  std::unique_ptr<worldkv::WorldSession> load() override;
  std::vector<HudLine> model_lines() const override;
};

// True when the options name a Matrix-Game-2.0 model: `mode` given, `model_path` a folder, or
// a file with a config.json beside it whose _class_name is CausalWanModel.
bool is_mg2_model(const std::string& model_path, const std::string& mode);

}  // namespace wm::viewer
