#include "viewer/generator.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "runtime/error.h"
#include "tools/rollout/world_adapter.h"

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

Generator::Generator(std::unique_ptr<worldkv::WorldSession> session, std::function<void()> on_result)
    : session_(std::move(session)), on_result_(std::move(on_result)) {
  WM_CHECK(session_ != nullptr, "no session");
  frames_per_chunk_ = session_->frames_per_chunk();
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

uint64_t Generator::reset(uint64_t seed, worldkv::Policy policy) {
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

ChunkResult Generator::generate(const Job& job) {
  ChunkResult r;
  r.epoch = job.epoch;
  r.chunk.index = session_->chunks_done();
  r.poses = job.chunk.poses;
  try {
    const std::vector<worldkv::FrameControl> controls = rollout::model_controls(job.chunk.poses, job.chunk.actions);
    r.chunk = !job.chunk.prompt_frames.empty() && session_->chunks_done() == 0
                  ? session_->prompt(job.chunk.prompt_frames, controls)
                  : session_->next(controls);
    r.memory = snapshot_memory(*session_->memory(), r.chunk.index, after_commit_, r.chunk.retrieved);
    after_commit_ = regions_of(*session_->memory());
  } catch (const std::exception& e) {
    r.error = str_cat("chunk ", r.chunk.index, ": ", e.what());
  }
  return r;
}

void Generator::run() {
  torch::NoGradGuard no_grad;  // grad mode is per thread
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (job.reset) {
      try {
        session_->reset(job.seed, job.policy.name());
        after_commit_.clear();
      } catch (const std::exception& e) {
        ChunkResult r;
        r.epoch = job.epoch;
        r.error = str_cat("reset to ", worldkv::policy_name(job.policy), ": ", e.what());
        {
          std::lock_guard<std::mutex> lock(mu_);
          results_.push_back(std::move(r));
        }
        if (on_result_) on_result_();
      }
      continue;
    }
    ChunkResult r = generate(job);
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
