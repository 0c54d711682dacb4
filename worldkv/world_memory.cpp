#include "worldkv/world_memory.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "worldkv/compression.h"

namespace wm::worldkv {

void MemoryConfig::validate() const {
  WM_CHECK(frames_per_chunk > 0, "frames_per_chunk must be > 0, got ", frames_per_chunk);
  WM_CHECK(tokens_per_frame > 0, "tokens_per_frame must be > 0, got ", tokens_per_frame);
  for (auto [name, f] : {std::pair{"sink", sink_frames}, std::pair{"retrieved", retrieved_frames},
                         std::pair{"recent", recent_frames}, std::pair{"denoise", denoise_frames}})
    WM_CHECK(f >= 0 && f % frames_per_chunk == 0, name, " frames (", f, ") must be whole chunks of ",
             frames_per_chunk, " frames");
  WM_CHECK(denoise_frames == frames_per_chunk, "the denoise region is one chunk (", frames_per_chunk,
           " frames), got ", denoise_frames);
  WM_CHECK(sink_frames + retrieved_frames + recent_frames > 0, "the window holds no context");
}

std::string WorldMemory::chunk_id(int64_t index) { return "chunk:" + std::to_string(index); }

WorldMemory::WorldMemory(KvSpec spec, MemoryConfig cfg) : spec_(std::move(spec)), cfg_(std::move(cfg)) {
  cfg_.validate();
  spec_.validate();
  time_axis_ = spec_.rope.axis_index(cfg_.time_axis);
  const int sink = cfg_.chunks(cfg_.sink_frames), ret = cfg_.chunks(cfg_.retrieved_frames),
            rec = cfg_.chunks(cfg_.recent_frames);
  std::vector<std::string> regions;
  switch (cfg_.policy) {
    case Policy::FullKv:
      regions = {"sink", "recent"};
      sink_cap_ = sink;
      recent_cap_ = -1;
      break;
    case Policy::SlidingWindow:
      regions = {"recent"};
      recent_cap_ = sink + ret + rec;
      break;
    case Policy::SinkRecent:
      regions = {"sink", "recent"};
      sink_cap_ = sink;
      recent_cap_ = ret + rec;
      break;
    default:
      regions = {"sink", "retrieved", "recent"};
      sink_cap_ = sink;
      retrieved_cap_ = ret;
      if (cfg_.policy == Policy::WorldKvC && cfg_.fill_by_tokens)
        retrieved_cap_ = static_cast<int>(
            static_cast<int64_t>(cfg_.retrieved_frames) * cfg_.tokens_per_frame /
            compressed_token_count(cfg_.frames_per_chunk, cfg_.tokens_per_frame, cfg_.compression));
      recent_cap_ = rec;
  }
  WM_CHECK(recent_cap_ != 0, "policy ", policy_name(cfg_.policy), " needs at least one recent chunk");
  window_ = std::make_unique<KvWindow>(spec_, regions);
  // Everything a bounded window will ever hold, the staged current chunk included: its memory
  // is allocated once and stays constant however long the rollout.
  window_->reserve(static_cast<int64_t>(cfg_.sink_frames + cfg_.retrieved_frames + cfg_.recent_frames +
                                        cfg_.denoise_frames) *
                   cfg_.tokens_per_frame);
  StoreConfig bc = cfg_.bank;
  bc.device = spec_.device;
  bank_ = std::make_unique<BlockStore>(bc);
  peak_window_bytes_ = window_->bytes_allocated();
}

std::vector<std::string> WorldMemory::region_ids(const std::string& region) const {
  std::vector<std::string> out;
  const auto& lay = window_->layout();
  for (auto& s : lay.segments(lay.region(region))) out.push_back(s.id);
  return out;
}

int64_t WorldMemory::first_frame_of(const std::string& id) const {
  return bank_->meta(id).created * cfg_.frames_per_chunk;
}

std::vector<Scored> WorldMemory::pick_by_attention(size_t k) const {
  // Probe: the mean key, per layer and head, of the most recent chunk in the window; each banked
  // chunk carries the same summary of its own keys. Score = sum over layers and heads of
  // probe . summary / sqrt(d): query-key importance with the recent keys standing in for the
  // next chunk's queries (which do not exist before it is denoised).
  const auto& lay = window_->layout();
  const auto& recent = lay.segments(lay.region("recent"));
  if (recent.empty()) return {};
  const std::string& pid = recent.back().id;
  std::vector<at::Tensor> probe;
  for (int l = 0; l < spec_.n_layers; ++l)
    probe.push_back(window_->k(l)
                        .narrow(1, lay.segment_begin(l, pid), lay.segment_len(l, pid))
                        .to(at::kFloat)
                        .mean(1)
                        .to(at::kCPU));
  at::Tensor p = at::stack(probe);  // [L, H, d]
  std::vector<Scored> out;
  for (auto& id : bank_->ids()) {
    const at::Tensor e = bank_->meta(id).embedding;
    const double s = (p * e).sum().item<double>() / std::sqrt(static_cast<double>(spec_.head_dim));
    out.push_back({id, -s});
  }
  std::stable_sort(out.begin(), out.end(), [](const Scored& a, const Scored& b) { return a.distance < b.distance; });
  if (out.size() > k) out.resize(k);
  return out;
}

void WorldMemory::rebuild_retrieved(int64_t index, const std::vector<Scored>& picks) {
  const auto& lay = window_->layout();
  std::unordered_set<std::string> want;
  for (auto& s : picks) want.insert(s.id);
  if (cfg_.placement == Placement::Original) {
    // Keep what stays selected; swap the rest.
    for (auto& id : region_ids("retrieved"))
      if (!want.count(id)) window_->drop(id);  // the bank keeps it
    for (auto& s : picks)
      if (lay.find(s.id).first < 0) window_->place("retrieved", bank_->get(s.id));
    return;
  }
  // Re-anchored: the retrieved chunks, in their original order, sit just before the recent region.
  window_->drop_region("retrieved");
  std::vector<std::string> ids;
  for (auto& s : picks) ids.push_back(s.id);
  std::sort(ids.begin(), ids.end(), [&](const std::string& a, const std::string& b) {
    return first_frame_of(a) < first_frame_of(b);
  });
  const auto recent = region_ids("recent");
  const int64_t fpc = cfg_.frames_per_chunk;
  const int64_t recent_start = recent.empty() ? index * fpc : (index - static_cast<int64_t>(recent.size())) * fpc;
  const int64_t m = static_cast<int64_t>(ids.size());
  for (int64_t j = 0; j < m; ++j) {
    const int64_t target = recent_start - (m - j) * fpc;
    window_->place("retrieved", bank_->get(ids[j]), Reanchor{time_axis_, target - first_frame_of(ids[j])});
  }
}

void WorldMemory::prepare(int64_t index, const std::vector<Pose>& poses) {
  WM_CHECK(index == next_index_, "chunks come in order: expected chunk ", next_index_, ", got ", index);
  WM_CHECK(!poses.empty(), "chunk ", index, " needs its frames' poses");
  last_retrieval_.clear();
  if (banks(cfg_.policy) && retrieved_cap_ > 0 && bank_->size() > 0) {
    last_retrieval_ = cfg_.policy == Policy::WorldKvAttn ? pick_by_attention(retrieved_cap_)
                                                         : index_.nearest(mean_pose(poses), retrieved_cap_);
    rebuild_retrieved(index, last_retrieval_);
  }
  peak_window_bytes_ = std::max(peak_window_bytes_, window_->bytes_allocated());
}

void WorldMemory::evict_oldest_recent() {
  const std::string id = region_ids("recent").front();
  const BlockMeta meta = window_meta_.at(id);
  window_meta_.erase(id);
  Block b = window_->remove(id);
  if (!banks(cfg_.policy)) return;  // dropped
  b.meta = meta;
  if (cfg_.policy == Policy::WorldKvC) b = compress_chunk(b, cfg_.tokens_per_frame, cfg_.compression);
  index_.add(id, from_vector(meta.pose));
  bank_->put(std::move(b), Tier::Device);
}

void WorldMemory::commit(int64_t index, std::vector<LayerKv> kv, const std::vector<Pose>& poses) {
  WM_CHECK(index == next_index_, "chunks come in order: expected chunk ", next_index_, ", got ", index);
  WM_CHECK(static_cast<int>(kv.size()) == spec_.n_layers, "chunk ", index, ": ", kv.size(), " layers of K/V, expected ",
           spec_.n_layers);
  WM_CHECK(!poses.empty(), "chunk ", index, " needs its frames' poses");
  Block b;
  b.id = chunk_id(index);
  const Pose mean = mean_pose(poses);
  b.meta.kind = "chunk";
  b.meta.pose = to_vector(mean);
  b.meta.created = index;
  if (cfg_.policy == Policy::WorldKvAttn) {
    std::vector<at::Tensor> summary;
    for (auto& l : kv) summary.push_back(l.k.to(at::kFloat).mean(1).to(at::kCPU));
    b.meta.embedding = at::stack(summary);  // [L, H, d]
  }
  for (auto& l : kv)
    if (!l.logw.defined()) l.logw = at::zeros({l.k.size(1)}, at::TensorOptions().dtype(at::kFloat).device(l.k.device()));
  b.layers = std::move(kv);
  window_meta_[b.id] = b.meta;
  const bool to_sink = sink_cap_ > 0 && static_cast<int>(region_ids_size("sink")) < sink_cap_;
  window_->place(to_sink ? "sink" : "recent", b);
  if (!to_sink && recent_cap_ > 0)
    while (static_cast<int>(region_ids("recent").size()) > recent_cap_) evict_oldest_recent();
  chunk_poses_.push_back(mean);
  ++next_index_;
  peak_window_bytes_ = std::max(peak_window_bytes_, window_->bytes_allocated());
}

}  // namespace wm::worldkv
