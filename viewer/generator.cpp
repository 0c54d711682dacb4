#include "viewer/generator.h"

#include <ATen/core/grad_mode.h>

#include "runtime/error.h"

namespace wm::viewer {

namespace {

using Regions = std::vector<std::pair<std::string, std::vector<std::string>>>;

Regions regions_of(const worldkv::WorldMemory& memory) {
  Regions out;
  for (const auto& name : memory.window().layout().region_names()) out.emplace_back(name, memory.region_ids(name));
  return out;
}

}  // namespace

MemorySnapshot snapshot_memory(const worldkv::WorldMemory& memory, int64_t index, const Regions& before,
                               const std::vector<std::string>& retrieved) {
  MemorySnapshot s;
  const auto& cfg = memory.config();
  s.policy = worldkv::policy_name(cfg.policy);
  for (const auto& name : memory.window().layout().region_names()) {
    std::vector<std::string> ids;
    if (name == "retrieved") {
      ids = retrieved;
    } else {
      for (const auto& [n, v] : before)
        if (n == name) ids = v;
    }
    s.window.emplace_back(name, std::move(ids));
  }
  s.window.emplace_back("denoise", std::vector<std::string>{worldkv::WorldMemory::chunk_id(index)});
  s.retrieved_capacity = memory.window_chunks(index).retrieved_slots;
  for (const auto& sc : memory.last_retrieval()) {
    s.retrieved.push_back(sc.id);
    s.retrieved_distance.push_back(sc.distance);
  }
  s.banked = memory.bank().ids();
  s.chunk_poses = memory.chunk_poses();
  for (int t = 0; t < 3; ++t) {
    s.tier_count[t] = memory.bank().count(static_cast<Tier>(t));
    s.tier_bytes[t] = memory.bank().bytes(static_cast<Tier>(t));
  }
  s.window_bytes = memory.window_bytes();
  return s;
}

MemorySnapshot snapshot_native(const worldkv::WorldSession& session, const worldkv::ChunkOutput& chunk) {
  MemorySnapshot s;
  s.policy = "native";
  s.window = {{"rolling", session.model().native_window_chunks(chunk.index)},
              {"denoise", {worldkv::WorldMemory::chunk_id(chunk.index)}}};
  s.window_bytes = chunk.window_bytes;
  return s;
}

Generator::Generator(std::unique_ptr<worldkv::WorldSession> session, std::function<void()> on_result)
    : session_(std::move(session)), on_result_(std::move(on_result)) {
  WM_CHECK(session_ != nullptr, "no session");
  info_ = session_->info();
  worker_ = std::thread([this] { run(); });
}

Generator::~Generator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int Generator::controls_for_chunk(int64_t index) const {
  return index == 0 ? 1 + info_.temporal_stride * (info_.frames_per_chunk - 1)
                    : info_.temporal_stride * info_.frames_per_chunk;
}

void Generator::submit(ChunkRequest request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job j;
    j.epoch = epoch_;
    j.chunk = std::move(request);
    jobs_.push_back(std::move(j));
    ++pending_chunks_;
  }
  cv_.notify_one();
}

uint64_t Generator::reset(uint64_t seed, const std::string& policy) {
  uint64_t e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = ++epoch_;
    Job j;
    j.reset = true;
    j.epoch = e;
    j.seed = seed;
    j.policy = policy;
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
  return e;
}

std::optional<ChunkResult> Generator::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (results_.empty()) return std::nullopt;
  ChunkResult r = std::move(results_.front());
  results_.pop_front();
  return r;
}

int Generator::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_chunks_;
}

uint64_t Generator::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

ChunkResult Generator::generate(Job& job) {
  ChunkResult r;
  r.epoch = job.epoch;
  r.chunk.index = session_->chunks_done();
  r.controls = job.chunk.controls;
  try {
    const bool prompt = !job.chunk.prompt_frames.empty() && session_->chunks_done() == 0;
    r.chunk = prompt ? session_->prompt(job.chunk.prompt_frames, job.chunk.controls) : session_->next(job.chunk.controls);
    r.chunk.latents = at::Tensor();  // the UI shows the frames
    if (const worldkv::WorldMemory* mem = session_->memory()) {
      r.memory = snapshot_memory(*mem, r.chunk.index, after_commit_, r.chunk.retrieved);
      after_commit_ = regions_of(*mem);
    } else {
      r.memory = snapshot_native(*session_, r.chunk);
    }
  } catch (const std::exception& e) {
    r.error = str_cat("chunk ", r.chunk.index, ": ", e.what());
  }
  return r;
}

void Generator::push(ChunkResult r, bool chunk) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (chunk) --pending_chunks_;
    if (stop_) return;
    results_.push_back(std::move(r));
  }
  if (on_result_) on_result_();
}

void Generator::run() {
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
    if (!job.reset) {
      push(generate(job), true);
      continue;
    }
    try {
      session_->reset(job.seed, job.policy);
      after_commit_.clear();
    } catch (const std::exception& e) {
      ChunkResult r;
      r.epoch = job.epoch;
      r.error = str_cat("reset to ", job.policy, ": ", e.what());
      push(std::move(r), false);
    }
  }
}

}  // namespace wm::viewer
