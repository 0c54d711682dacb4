#include "worldkv/session.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>

#include "dit/weights.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "worldkv/conditioning.h"

namespace wm::worldkv {

dit::CausalDit load_world_model(const std::string& path, at::Device device) {
  dit::CausalDit m = dit::load_model(path, device);
  m->eval();
  return m;
}

WorldSession::WorldSession(dit::CausalDit model, SessionConfig cfg, at::Device device)
    : model_(std::move(model)), cfg_(std::move(cfg)), device_(device) {
  const auto& mc = model_->config();
  cfg_.memory.tokens_per_frame = mc.tokens_per_frame();
  cfg_.memory.frames_per_chunk = mc.frames_per_chunk;
  cfg_.memory.denoise_frames = mc.frames_per_chunk;
  codec_ = dit::make_codec(mc);
  reset(cfg_.seed);
}

int WorldSession::frames_per_chunk() const { return model_->config().frames_per_chunk; }

void WorldSession::reset(uint64_t seed) { reset(seed, cfg_.memory.policy); }

void WorldSession::reset(uint64_t seed, Policy policy) {
  cfg_.seed = seed;
  cfg_.memory.policy = policy;
  memory_ = std::make_unique<WorldMemory>(model_->kv_spec(device_), cfg_.memory);
  codec_->reset();  // a new rollout for a streaming decoder
  gen_ = at::detail::createCPUGenerator(seed);
  next_index_ = 0;
  last_latent_ = at::Tensor();
}

void WorldSession::keep_last_frame(const at::Tensor& latents, const dit::FrameCond& cond) {
  if (!model_->config().cond.warp_reference) return;  // only such a model reads it
  last_latent_ = latents[latents.size(0) - 1].clone();
  last_yaw_deg_ = cond.pose[cond.pose.size(0) - 1][2].item<double>();
}

void WorldSession::record_memory_size(ChunkOutput& out) const {
  out.window_bytes = memory_->window_bytes();
  for (int t = 0; t < 3; ++t) out.bank_bytes[t] = memory_->bank().bytes(static_cast<Tier>(t));
}

ChunkOutput WorldSession::prompt(const std::vector<Image>& frames, const std::vector<Pose>& poses,
                                const std::vector<Action>& actions) {
  const int F = frames_per_chunk();
  WM_CHECK(next_index_ == 0, "a prompt starts the rollout; ", next_index_, " chunks are already made");
  WM_CHECK(static_cast<int>(frames.size()) == F && static_cast<int>(poses.size()) == F &&
               static_cast<int>(actions.size()) == F,
           "a prompt is one chunk of ", F, " frames: got ", frames.size(), " frames, ", poses.size(), " poses, ",
           actions.size(), " actions");
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_ms();
  at::NoGradGuard ng;
  memory_->prepare(0, poses);
  const dit::FrameCond cond = frame_cond(poses, actions, model_->config().cond, device_);
  std::vector<LayerKv> kv;
  const at::Tensor latents = codec_->encode_images(frames, device_);
  model_->forward_chunk(latents, at::scalar_tensor(0.0, at::kFloat), cond, 0, &memory_->window(), &kv);
  keep_last_frame(latents, cond);
  memory_->commit(0, std::move(kv), poses);
  ChunkOutput out;
  out.index = 0;
  out.frames = frames;
  out.prompt = true;
  ++next_index_;
  out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  out.cpu_ms = process_cpu_ms() - cpu0;
  record_memory_size(out);
  return out;
}

ChunkOutput WorldSession::next(const std::vector<Pose>& poses, const std::vector<Action>& actions) {
  const int F = frames_per_chunk();
  WM_CHECK(static_cast<int>(poses.size()) == F && static_cast<int>(actions.size()) == F, "a chunk is ", F,
           " frames: got ", poses.size(), " poses and ", actions.size(), " actions");
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_ms();
  ChunkOutput out;
  out.index = next_index_;
  using Clock = std::chrono::steady_clock;
  auto t_mem = Clock::now();
  memory_->prepare(out.index, poses);
  out.memory_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_mem).count();
  if (memory_->policy().banks()) out.retrieved = memory_->region_ids("retrieved");
  dit::FrameCond cond = frame_cond(poses, actions, model_->config().cond, device_);
  if (model_->config().cond.warp_reference && last_latent_.defined())
    cond.reference = dit::warp_reference(last_latent_, last_yaw_deg_, cond.pose.select(1, 2), model_->config().cond);
  dit::ChunkResult r = dit::generate_chunk(model_, &memory_->window(), cond, out.index * F, cfg_.sampler, gen_);
  keep_last_frame(r.latents, cond);
  t_mem = Clock::now();
  memory_->commit(out.index, std::move(r.kv), poses);
  out.memory_ms += std::chrono::duration<double, std::milli>(Clock::now() - t_mem).count();
  out.frames = codec_->decode_images(r.latents);
  ++next_index_;
  out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  out.cpu_ms = process_cpu_ms() - cpu0;
  record_memory_size(out);
  return out;
}

}  // namespace wm::worldkv
