#pragma once
// The tiny causal DiT (dit/model.h) as a model kind of the session (worldkv/session.h): driven
// by the camera pose and the action of every frame (worldkv/conditioning.h: the one place where
// radians become the degrees it was trained on), sampled by the flow sampler (dit/sampler.h),
// its frames through its codec (pixel patches, one video frame a latent frame). It can start a
// rollout from given frames (prompt). A warp_reference model also reads the last frame made,
// turned to the new yaws (dit/README.md): the adapter keeps that frame between chunks.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "dit/codec.h"
#include "dit/conditioning.h"
#include "dit/model.h"
#include "dit/sampler.h"
#include "worldkv/model_adapter.h"

namespace wm::worldkv {

class TinyDitAdapter final : public ModelAdapter {
 public:
  // The model is shared (adapters of several sessions may use one); the codec is the model's.
  // Throws wm::Error for a codec the config names but this build cannot make.
  TinyDitAdapter(dit::CausalDit model, dit::SamplerConfig sampler, at::Device device);

  const ModelInfo& info() const override { return info_; }
  KvSpec kv_spec() const override { return model_->kv_spec(device_); }
  Pose next_pose(const Pose& previous, const FrameControl& control) const override;
  void reset(bool native) override;
  SampledChunk sample(const ChunkStep& step) override;
  SampledChunk prompt(const std::vector<Image>& frames, const ChunkStep& step) override;
  std::vector<Image> decode(const at::Tensor& latents) override;

  const dit::CausalDit& model() const { return model_; }
  const dit::SamplerConfig& sampler() const { return sampler_; }

 private:
  // The chunk's conditioning: its poses and actions (and the warped reference for such a model).
  dit::FrameCond condition(const ChunkStep& step) const;
  // Keeps the chunk's last frame and its yaw (cond.pose's last row) for the next reference
  // (warp_reference models; a no-op for the others).
  void keep_last_frame(const at::Tensor& latents, const dit::FrameCond& cond);

  dit::CausalDit model_;
  dit::SamplerConfig sampler_;
  at::Device device_;
  std::unique_ptr<dit::Codec> codec_;
  ModelInfo info_;
  // The last frame made (or prompted), latents [C, h, w], and its yaw in degrees: the next
  // chunk's reference for a warp_reference model.
  at::Tensor last_latent_;
  double last_yaw_deg_ = 0;
};

// Loads a model saved by the trainer (config in its metadata) onto `device`, in eval mode.
// Throws wm::Error (or wm::CorruptData) naming the file.
dit::CausalDit load_world_model(const std::string& path, at::Device device);

}  // namespace wm::worldkv
