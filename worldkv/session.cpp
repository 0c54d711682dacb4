#include "worldkv/session.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <chrono>

#include "runtime/clock.h"
#include "runtime/error.h"
#include "worldkv/chunk_payload.h"

namespace wm::worldkv {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

void SessionConfig::set_policy(const std::string& name) {
  if (name == "native") {
    native_window = true;
    return;
  }
  memory.policy = parse_policy(name);
  native_window = false;
}

std::string SessionConfig::policy_name() const { return native_window ? "native" : memory.policy.name(); }

void SessionConfig::check() const {
  if (memory.kv_files_dir.empty()) return;
  if (native_window)
    throw Error(str_cat("the window in files (", memory.kv_files_dir, ") is a memory policy's; policy native ",
                        "keeps the model's own window in memory: give a video policy"));
  MappedStorage(memory.kv_files_dir).empty({1}, at::kByte);  // the folder takes a file
}

WorldSession::WorldSession(std::unique_ptr<ModelAdapter> model, SessionConfig cfg)
    : model_(std::move(model)), cfg_(std::move(cfg)) {
  WM_CHECK(model_ != nullptr, "WorldSession: no model");
  const ModelInfo& mi = model_->info();
  WM_CHECK(mi.frames_per_chunk > 0 && mi.tokens_per_frame > 0 && mi.temporal_stride > 0, "WorldSession: the ",
           mi.kind, " model gives ", mi.frames_per_chunk, " frames a chunk, ", mi.tokens_per_frame,
           " tokens a frame, temporal stride ", mi.temporal_stride);
  cfg_.memory.tokens_per_frame = mi.tokens_per_frame;
  cfg_.memory.frames_per_chunk = mi.frames_per_chunk;
  cfg_.memory.denoise_frames = mi.frames_per_chunk;
  reset(cfg_.seed, cfg_.policy_name());
}

void WorldSession::reset(uint64_t seed) { reset(seed, cfg_.policy_name()); }

void WorldSession::reset(uint64_t seed, const std::string& policy) {
  SessionConfig next = cfg_;
  next.set_policy(policy);
  next.seed = seed;
  if (next.native_window && !model_->info().native_window)
    throw Error(str_cat("the ", model_->info().kind, " model has no window of its own (policy native): give a ",
                        "video policy"));
  next.check();
  if (!next.native_window) next.memory.validate();
  // The old windows go before the new ones are made (on a GPU both at once may not fit).
  memory_.reset();
  model_->reset(next.native_window);
  cfg_ = std::move(next);
  if (!cfg_.native_window) memory_ = std::make_unique<WorldMemory>(model_->kv_spec(), cfg_.memory);
  states_.clear();
  controls_.clear();
  poses_.clear();
  gen_ = at::detail::createCPUGenerator(seed);
  next_index_ = 0;
}

int WorldSession::controls_for_chunk(int64_t index) const {
  const ModelInfo& mi = model_->info();
  return index == 0 ? 1 + mi.temporal_stride * (mi.frames_per_chunk - 1) : mi.temporal_stride * mi.frames_per_chunk;
}

std::vector<Pose> WorldSession::take_controls(const std::vector<FrameControl>& controls) {
  const int want = controls_for_next_chunk();
  WM_CHECK(static_cast<int>(controls.size()) == want, "chunk ", next_index_, " takes ", want,
           " video frames of control, got ", controls.size());
  model_->check_controls(controls);
  for (const auto& c : controls) {
    controls_.push_back(c);
    poses_.push_back(model_->next_pose(poses_.empty() ? Pose{} : poses_.back(), c));
  }
  const ModelInfo& mi = model_->info();
  std::vector<Pose> latent_poses;
  for (int64_t j = next_index_ * mi.frames_per_chunk; j < (next_index_ + 1) * mi.frames_per_chunk; ++j)
    latent_poses.push_back(poses_.at(static_cast<size_t>(mi.temporal_stride * j)));
  return latent_poses;
}

std::vector<HeldChunk> WorldSession::held_chunks() const {
  const KvWindow& w = memory_->window();
  const auto& lay = w.layout();
  const at::Tensor pos = w.pos(0);
  std::vector<HeldChunk> held;
  for (int r = 0; r < lay.n_regions(); ++r)
    for (const auto& seg : lay.segments(r)) {
      auto it = states_.find(seg.id);
      WM_CHECK(it != states_.end(), "the window holds ", seg.id, " but the model's state of it is gone");
      HeldChunk h{seg.id, 0, it->second.get()};
      if (lay.segment_len(0, seg.id) > 0) {
        const int64_t t_now = pos[lay.segment_begin(0, seg.id)][0].item<int64_t>();
        h.shift = t_now - chunk_payload(w.meta(seg.id), seg.id).first_frame();
      }
      held.push_back(std::move(h));
    }
  return held;
}

ChunkStep WorldSession::make_step(const std::vector<Pose>& latent_poses) {
  ChunkStep step;
  step.index = next_index_;
  step.first_frame = next_index_ * model_->info().frames_per_chunk;
  step.controls = &controls_;
  step.first_control = controls_.size() - static_cast<size_t>(controls_for_next_chunk());
  step.latent_poses = &latent_poses;
  step.gen = &gen_;
  if (memory_) {
    step.window = &memory_->window();
    if (model_->info().chunk_state) step.held = held_chunks();
  }
  return step;
}

void WorldSession::prepare(const std::vector<Pose>& latent_poses, ChunkOutput& out) {
  if (!memory_) return;
  const auto t0 = Clock::now();
  memory_->prepare(out.index, latent_poses);
  out.memory_ms += ms_since(t0);
  if (memory_->policy().banks()) out.retrieved = memory_->region_ids("retrieved");
}

void WorldSession::commit(SampledChunk& s, const std::vector<Pose>& latent_poses, ChunkOutput& out) {
  if (!memory_) return;
  const auto t0 = Clock::now();
  const std::string id = WorldMemory::chunk_id(out.index);
  if (s.state) states_[id] = s.state;
  memory_->commit(out.index, std::move(s.kv), latent_poses);
  for (auto it = states_.begin(); it != states_.end();) {
    const bool in_window = memory_->window().layout().find(it->first).first >= 0;
    it = in_window || memory_->bank().contains(it->first) ? std::next(it) : states_.erase(it);
  }
  out.memory_ms += ms_since(t0);
}

void WorldSession::record_sizes(ChunkOutput& out) const {
  if (!memory_) {
    out.window_bytes = model_->native_window_bytes();
    out.state_bytes = model_->native_state_bytes();
    return;
  }
  out.window_bytes = memory_->window_bytes();
  for (const auto& kv : states_) out.state_bytes += kv.second->nbytes();
  for (int t = 0; t < 3; ++t) out.bank_bytes[t] = memory_->bank().bytes(static_cast<Tier>(t));
}

ChunkOutput WorldSession::prompt(const std::vector<Image>& frames, const std::vector<FrameControl>& controls) {
  WM_CHECK(next_index_ == 0, "a prompt starts the rollout; ", next_index_, " chunks are already made");
  WM_CHECK(model_->info().prompt_frames, "the ", model_->info().kind, " model does not start from given frames");
  WM_CHECK(memory_ != nullptr, "a prompt goes into the world memory's window, not the model's own");
  WM_CHECK(frames.size() == controls.size(), "a prompt is one frame per control: got ", frames.size(), " frames, ",
           controls.size(), " controls");
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_ms();
  at::NoGradGuard ng;
  ChunkOutput out;
  out.index = 0;
  const std::vector<Pose> latent_poses = take_controls(controls);
  prepare(latent_poses, out);
  SampledChunk s = model_->prompt(frames, make_step(latent_poses));
  out.latents = s.latents.to(at::kCPU, at::kFloat);
  commit(s, latent_poses, out);
  out.frames = frames;
  out.poses.assign(poses_.end() - static_cast<std::ptrdiff_t>(controls.size()), poses_.end());
  out.prompt = true;
  ++next_index_;
  out.ms = ms_since(t0);
  out.cpu_ms = process_cpu_ms() - cpu0;
  record_sizes(out);
  return out;
}

ChunkOutput WorldSession::next(const std::vector<FrameControl>& controls) {
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_ms();
  at::NoGradGuard ng;
  ChunkOutput out;
  out.index = next_index_;
  const std::vector<Pose> latent_poses = take_controls(controls);
  prepare(latent_poses, out);
  const auto ts = Clock::now();
  SampledChunk s = model_->sample(make_step(latent_poses));
  out.model_ms = ms_since(ts);
  commit(s, latent_poses, out);
  out.latents = s.latents.to(at::kCPU, at::kFloat);
  const auto td = Clock::now();
  out.frames = model_->decode(s.latents);
  out.decode_ms = ms_since(td);
  out.poses.assign(poses_.end() - static_cast<std::ptrdiff_t>(controls.size()), poses_.end());
  ++next_index_;
  out.ms = ms_since(t0);
  out.cpu_ms = process_cpu_ms() - cpu0;
  record_sizes(out);
  return out;
}

}  // namespace wm::worldkv
