#pragma once
// wm_revisit_bench on LingBot-World-Fast: each episode's rollout starts from the ground truth of
// its frame 0 (the model's first image, encoded by the Wan VAE at the video size) and is driven
// by the episode's poses, one a video frame (9 for the first chunk, 12 after), as a known
// trajectory (upstream's offline camera input). The ground truth is rendered at the video size
// with the field of view of the model's intrinsics.
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dit/lingbot_model.h"
#include "tools/world/raycaster.h"
#include "tools/world/trajectory.h"
#include "worldkv/model_adapter.h"

namespace wm::rollout {

struct LingbotBenchModel {
  std::string dir;           // the model folder (as the hub's)
  std::string vae;           // Wan VAE (empty: Wan2.1_VAE.pth, else .safetensors, beside the folder)
  std::string text_context;  // safetensors with `context`
  std::optional<std::string> prompt;  // text through umT5 instead (neither: zero rows)
  int height = 480, width = 832;  // the video (and ground-truth) size, multiples of 16
  int cond_latents = 0;      // latent frames of the image condition to encode (0: all the episode's)
  at::ScalarType dtype = at::kFloat;
};

// A LingBot model loaded once, making one adapter per rollout.
class LingbotRollouts {
 public:
  // Encodes the prompt (or reads the text context), then loads the DiT and checks the VAE. Throws
  // wm::Error naming a bad file.
  LingbotRollouts(LingbotBenchModel m, at::Device device);
  // The ground truth's render settings: the video size and the intrinsics' field of view.
  world::RenderSpec render_spec() const;
  // The adapter of a rollout of the episode's first n frames: frame0 is its ground-truth frame 0.
  std::unique_ptr<worldkv::ModelAdapter> make(const world::Episode& ep, int n, const Image& frame0) const;
  int frames_per_chunk() const { return model_->config().frames_per_chunk; }

 private:
  LingbotBenchModel m_;
  at::Device device_;
  at::Tensor text_;  // made before the DiT is loaded (the umT5 encoder freed first)
  dit::LingbotDit model_;
  std::string vae_path_;
};

}  // namespace wm::rollout
