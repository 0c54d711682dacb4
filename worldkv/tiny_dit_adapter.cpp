#include "worldkv/tiny_dit_adapter.h"

#include "dit/weights.h"
#include "runtime/error.h"
#include "worldkv/conditioning.h"

namespace wm::worldkv {

dit::CausalDit load_world_model(const std::string& path, at::Device device) {
  dit::CausalDit m = dit::load_model(path, device);
  m->eval();
  return m;
}

TinyDitAdapter::TinyDitAdapter(dit::CausalDit model, dit::SamplerConfig sampler, at::Device device)
    : model_(std::move(model)), sampler_(std::move(sampler)), device_(device) {
  const dit::DitConfig& mc = model_->config();
  codec_ = dit::make_codec(mc);
  info_.kind = "tiny_dit";
  info_.name = mc.name;
  info_.controls = "pose+action";
  info_.frames_per_chunk = mc.frames_per_chunk;
  info_.tokens_per_frame = mc.tokens_per_frame();
  info_.temporal_stride = 1;
  info_.frame_width = mc.codec.image_width;
  info_.frame_height = mc.codec.image_height;
  info_.hfov_deg = mc.cond.hfov_deg;
  info_.prompt_frames = true;
}

Pose TinyDitAdapter::next_pose(const Pose& previous, const FrameControl& control) const {
  (void)previous;
  return control.pose;  // driven by the pose itself
}

void TinyDitAdapter::reset(bool native) {
  WM_CHECK(!native, "the tiny DiT has no window of its own");
  codec_->reset();  // a new rollout for a streaming decoder
  last_latent_ = at::Tensor();
}

dit::FrameCond TinyDitAdapter::condition(const ChunkStep& step) const {
  std::vector<Pose> poses;
  std::vector<Action> actions;
  for (const FrameControl& c : step.chunk_controls()) {
    poses.push_back(c.pose);
    actions.push_back(c.action);
  }
  return frame_cond(poses, actions, model_->config().cond, device_);
}

void TinyDitAdapter::keep_last_frame(const at::Tensor& latents, const dit::FrameCond& cond) {
  if (!model_->config().cond.warp_reference) return;  // only such a model reads it
  last_latent_ = latents[latents.size(0) - 1].clone();
  last_yaw_deg_ = cond.pose[cond.pose.size(0) - 1][2].item<double>();
}

SampledChunk TinyDitAdapter::sample(const ChunkStep& step) {
  WM_CHECK(step.window != nullptr, "the tiny DiT samples over the world memory's window");
  dit::FrameCond cond = condition(step);
  const dit::CondConfig& cc = model_->config().cond;
  if (cc.warp_reference && last_latent_.defined())
    cond.reference = dit::warp_reference(last_latent_, last_yaw_deg_, cond.pose.select(1, 2), cc);
  dit::ChunkResult r = dit::generate_chunk(model_, step.window, cond, step.first_frame, sampler_, *step.gen);
  keep_last_frame(r.latents, cond);
  return SampledChunk{std::move(r.latents), std::move(r.kv), nullptr};
}

SampledChunk TinyDitAdapter::prompt(const std::vector<Image>& frames, const ChunkStep& step) {
  WM_CHECK(step.window != nullptr, "a prompt goes into the world memory's window");
  const dit::FrameCond cond = condition(step);
  SampledChunk s;
  s.latents = codec_->encode_images(frames, device_);
  model_->forward_chunk(s.latents, at::scalar_tensor(0.0, at::kFloat), cond, step.first_frame, step.window, &s.kv);
  keep_last_frame(s.latents, cond);
  return s;
}

std::vector<Image> TinyDitAdapter::decode(const at::Tensor& latents) { return codec_->decode_images(latents); }

}  // namespace wm::worldkv
