#include "viewer/mg2_generator.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>

#include "runtime/error.h"
#include "worldkv/world_memory.h"

namespace wm::viewer {

Mg2Generator::Mg2Generator(Mg2Start start, std::unique_ptr<dit::Codec> codec, std::function<void()> on_result)
    : start_(std::move(start)), codec_(std::move(codec)), on_result_(std::move(on_result)) {
  WM_CHECK(start_.model, "Mg2Generator: no model");
  WM_CHECK(codec_ != nullptr, "Mg2Generator: no codec (the frames are decoded with the Wan VAE)");
  session_ = make_session(start_.session.policy_name());
  worker_ = std::thread([this] { run(); });
}

Mg2Generator::~Mg2Generator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::unique_ptr<worldkv::WorldSession> Mg2Generator::make_session(const std::string& policy) const {
  worldkv::SessionConfig cfg = start_.session;
  cfg.set_policy(policy);
  return std::make_unique<worldkv::WorldSession>(
      std::make_unique<worldkv::Mg2Adapter>(start_.model, nullptr, start_.image_latents, start_.clip_tokens,
                                            worldkv::Mg2Options{}, start_.device),
      cfg);
}

int Mg2Generator::inputs_for_chunk(int64_t index) const {
  const int F = start_.model->config().frames_per_chunk;
  return index == 0 ? 1 + 4 * (F - 1) : 4 * F;
}

void Mg2Generator::submit(std::vector<worldkv::Mg2Input> inputs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job j;
    j.epoch = epoch_;
    j.inputs = std::move(inputs);
    jobs_.push_back(std::move(j));
    ++pending_chunks_;
  }
  cv_.notify_one();
}

uint64_t Mg2Generator::restart(const std::string& policy) {
  uint64_t e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = ++epoch_;
    Job j;
    j.restart = true;
    j.epoch = e;
    j.policy = policy;
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
  return e;
}

std::optional<Mg2Result> Mg2Generator::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (results_.empty()) return std::nullopt;
  Mg2Result r = std::move(results_.front());
  results_.pop_front();
  return r;
}

int Mg2Generator::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_chunks_;
}

Mg2Result Mg2Generator::generate(const Job& job) {
  Mg2Result r;
  r.epoch = job.epoch;
  r.inputs = job.inputs;
  if (!session_) {  // a failed restart left none; its error result went first
    r.error = "no session (the restart before this chunk failed)";
    return r;
  }
  r.chunk.index = session_->chunks_done();
  try {
    const auto& mc = start_.model->config();
    const worldkv::WorldMemory* mem = session_->memory();
    r.chunk = session_->next(worldkv::mg2_controls(job.inputs));
    const auto t0 = std::chrono::steady_clock::now();
    r.chunk.frames = codec_->decode_images(r.chunk.latents);
    r.decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WM_CHECK(r.chunk.frames.size() == job.inputs.size(), "chunk ", r.chunk.index, ": the codec gave ",
             r.chunk.frames.size(), " frames for ", job.inputs.size(), " inputs");
    const auto& poses = session_->poses();
    r.poses.assign(poses.end() - static_cast<long>(job.inputs.size()), poses.end());
    if (mem) {
      r.memory = snapshot_memory(*mem, r.chunk.index, after_commit_, r.chunk.retrieved);
      after_commit_.clear();
      for (const auto& name : mem->window().layout().region_names())
        after_commit_.emplace_back(name, mem->region_ids(name));
    } else {
      r.memory.policy = "native";
      r.memory.window = {{"rolling", worldkv::mg2_rolling_window_chunks(r.chunk.index, mc.local_attn_size, mc.frames_per_chunk)},
                         {"denoise", {worldkv::WorldMemory::chunk_id(r.chunk.index)}}};
      r.memory.window_bytes = r.chunk.window_bytes;
    }
  } catch (const std::exception& e) {
    r.error = str_cat("chunk ", r.chunk.index, ": ", e.what());
  }
  return r;
}

void Mg2Generator::run() {
  at::NoGradGuard no_grad;  // grad mode is per thread
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (job.restart) {
      try {
        session_.reset();  // the old session's window goes before the new one is made
        session_ = make_session(job.policy);
        codec_->reset();
        after_commit_.clear();
      } catch (const std::exception& e) {
        Mg2Result r;
        r.epoch = job.epoch;
        r.error = str_cat("restart with ", job.policy, ": ", e.what());
        {
          std::lock_guard<std::mutex> lock(mu_);
          results_.push_back(std::move(r));
        }
        if (on_result_) on_result_();
      }
      continue;
    }
    Mg2Result r = generate(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_chunks_;
      if (stop_) return;
      results_.push_back(std::move(r));
    }
    if (on_result_) on_result_();
  }
}

}  // namespace wm::viewer
