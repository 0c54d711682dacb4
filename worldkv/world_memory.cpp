#include "worldkv/world_memory.h"

#include <algorithm>

#include "runtime/error.h"

namespace wm::worldkv {

namespace {

// The regions VideoPolicy::admit builds: the first chunks fill the sink, the next ones go to
// recent, whose oldest leave (to the bank, for a policy that banks) beyond its capacity.
WindowChunks window_chunks_of(const VideoPolicy& policy, int64_t target) {
  WM_CHECK(target >= 0, "window_chunks: chunk index must be >= 0, got ", target);
  const int64_t sink_end = std::min<int64_t>(target, policy.sink_capacity());
  const int64_t recent_begin =
      policy.recent_capacity() < 0 ? sink_end : std::max<int64_t>(sink_end, target - policy.recent_capacity());
  WindowChunks w;
  for (int64_t c = 0; c < sink_end; ++c) w.sink.push_back(c);
  if (policy.banks())
    for (int64_t c = sink_end; c < recent_begin; ++c) w.banked.push_back(c);
  w.retrieved_slots = policy.retrieved_capacity();
  for (int64_t c = recent_begin; c < target; ++c) w.recent.push_back(c);
  return w;
}

}  // namespace

WindowChunks window_chunks(const MemoryConfig& cfg, int64_t target) {
  cfg.validate();
  return window_chunks_of(*make_policy(cfg), target);
}

WindowChunks WorldMemory::window_chunks(int64_t target) const { return window_chunks_of(*policy_, target); }

std::string WorldMemory::chunk_id(int64_t index) { return "chunk:" + std::to_string(index); }

WorldMemory::WorldMemory(KvSpec spec, MemoryConfig cfg) : spec_(std::move(spec)), cfg_(std::move(cfg)) {
  cfg_.validate();
  spec_.validate();
  spec_.rope.axis_index(cfg_.time_axis);  // throws if the spec has no such axis
  policy_ = make_policy(cfg_);
  memory_ = std::make_unique<KvMemory>(spec_, policy_->regions(), cfg_.bank);
  if (!cfg_.kv_files_dir.empty()) memory_->window().use_storage(std::make_shared<MappedStorage>(cfg_.kv_files_dir));
  // Everything a bounded window will ever hold, the staged current chunk included: its memory
  // is allocated once and stays constant however long the rollout.
  memory_->window().reserve(static_cast<int64_t>(cfg_.sink_frames + cfg_.retrieved_frames + cfg_.recent_frames +
                                                 cfg_.denoise_frames) *
                            cfg_.tokens_per_frame);
  peak_window_bytes_ = window_bytes();
}

std::vector<std::string> WorldMemory::region_ids(const std::string& region) const {
  std::vector<std::string> out;
  const auto& lay = window().layout();
  for (auto& s : lay.segments(lay.region(region))) out.push_back(s.id);
  return out;
}

BlockMeta WorldMemory::chunk_meta(int64_t index, const std::vector<Pose>& poses) const {
  BlockMeta m;
  m.kind = "chunk";
  m.created = index;
  m.payload = std::make_shared<ChunkPayload>(mean_pose(poses), index * cfg_.frames_per_chunk);
  return m;
}

void WorldMemory::prepare(int64_t index, const std::vector<Pose>& poses) {
  WM_CHECK(index == next_index_, "chunks come in order: expected chunk ", next_index_, ", got ", index);
  WM_CHECK(!poses.empty(), "chunk ", index, " needs its frames' poses");
  memory_->apply(policy_->prepare(*memory_, chunk_meta(index, poses)));
  peak_window_bytes_ = std::max(peak_window_bytes_, window_bytes());
}

void WorldMemory::commit(int64_t index, std::vector<LayerKv> kv, const std::vector<Pose>& poses) {
  WM_CHECK(index == next_index_, "chunks come in order: expected chunk ", next_index_, ", got ", index);
  WM_CHECK(static_cast<int>(kv.size()) == spec_.n_layers, "chunk ", index, ": ", kv.size(), " layers of K/V, expected ",
           spec_.n_layers);
  WM_CHECK(!poses.empty(), "chunk ", index, " needs its frames' poses");
  Block b;
  b.id = chunk_id(index);
  b.meta = chunk_meta(index, poses);
  for (auto& l : kv)
    if (!l.logw.defined()) l.logw = at::zeros({l.k.size(1)}, at::TensorOptions().dtype(at::kFloat).device(l.k.device()));
  b.layers = std::move(kv);
  const Pose mean = chunk_payload(b.meta, b.id).pose();
  memory_->apply(policy_->admit(*memory_, std::move(b)));
  chunk_poses_.push_back(mean);
  ++next_index_;
  peak_window_bytes_ = std::max(peak_window_bytes_, window_bytes());
}

}  // namespace wm::worldkv
