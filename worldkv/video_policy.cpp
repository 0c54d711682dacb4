#include "worldkv/video_policy.h"

#include <algorithm>
#include <unordered_set>

#include "runtime/error.h"
#include "worldkv/chunk_payload.h"

namespace wm::worldkv {

namespace {
std::vector<std::string> ids_of(const WindowLayout& lay, const std::string& region) {
  std::vector<std::string> out;
  for (auto& s : lay.segments(lay.region(region))) out.push_back(s.id);
  return out;
}
}  // namespace

VideoPolicy::VideoPolicy(const MemoryConfig& cfg, std::vector<std::string> regions, int sink_chunks,
                         int retrieved_chunks, int recent_chunks)
    : cfg_(cfg), regions_(std::move(regions)), sink_(sink_chunks), retrieved_(retrieved_chunks), recent_(recent_chunks) {
  WM_CHECK(recent_ != 0, "policy ", cfg_.policy.name(), " needs at least one recent chunk");
}

MemoryPlan VideoPolicy::prepare(const KvMemory&, const BlockMeta&) {
  last_retrieval_.clear();
  return {};
}

MemoryPlan VideoPolicy::admit(const KvMemory& memory, Block chunk) {
  const KvWindow& window = memory.window();
  const auto& lay = window.layout();
  const bool to_sink = sink_ > 0 && static_cast<int>(lay.segments(lay.region("sink")).size()) < sink_;
  std::vector<std::string> recent;
  if (!to_sink) recent = ids_of(lay, "recent");
  MemoryPlan plan;
  plan.insert(to_sink ? "sink" : "recent", std::move(chunk));
  if (!to_sink && recent_ > 0)  // recent gains one chunk; its oldest leave while it is over capacity
    for (size_t i = 0; static_cast<int>(recent.size() + 1 - i) > recent_; ++i)
      evict(recent.at(i), window.meta(recent[i]), plan);
  return plan;
}

void VideoPolicy::evict(const std::string& id, const BlockMeta&, MemoryPlan& plan) { plan.drop(id); }

RetrievalPolicy::RetrievalPolicy(const MemoryConfig& cfg, int retrieved_chunks)
    : VideoPolicy(cfg, {"sink", "retrieved", "recent"}, cfg.chunks(cfg.sink_frames), retrieved_chunks,
                  cfg.chunks(cfg.recent_frames)) {}

void RetrievalPolicy::evict(const std::string& id, const BlockMeta& meta, MemoryPlan& plan) {
  index_.add(id, chunk_payload(meta, id).pose());
  plan.bank(id, compressor());
}

std::vector<Scored> RetrievalPolicy::pick(const KvMemory&, const BlockMeta& next, size_t k) const {
  return index_.nearest(chunk_payload(next, "next chunk").pose(), k);
}

MemoryPlan RetrievalPolicy::prepare(const KvMemory& memory, const BlockMeta& next) {
  last_retrieval_.clear();
  if (retrieved_capacity() <= 0 || memory.bank().size() == 0) return {};
  last_retrieval_ = pick(memory, next, static_cast<size_t>(retrieved_capacity()));
  return refill(memory, next, last_retrieval_);
}

MemoryPlan RetrievalPolicy::refill(const KvMemory& memory, const BlockMeta& next,
                                   const std::vector<Scored>& picks) const {
  const auto& lay = memory.window().layout();
  MemoryPlan plan;
  if (cfg_.placement == Placement::Original) {
    // Keep what stays selected; swap the rest.
    std::unordered_set<std::string> want;
    for (auto& s : picks) want.insert(s.id);
    for (auto& id : ids_of(lay, "retrieved"))
      if (!want.count(id)) plan.drop(id);  // the bank keeps it
    for (auto& s : picks)
      if (lay.find(s.id).first < 0) plan.fetch(s.id, "retrieved");
    return plan;
  }
  // Re-anchored: the retrieved chunks, in their original order, sit just before the recent region.
  for (auto& id : ids_of(lay, "retrieved")) plan.drop(id);
  std::vector<std::pair<int64_t, std::string>> chunks;  // first frame, id
  for (auto& s : picks) chunks.emplace_back(chunk_payload(memory.bank().meta(s.id), s.id).first_frame(), s.id);
  std::sort(chunks.begin(), chunks.end());
  const int64_t fpc = cfg_.frames_per_chunk;
  const int64_t recent_start =
      chunk_payload(next, "next chunk").first_frame() - static_cast<int64_t>(ids_of(lay, "recent").size()) * fpc;
  const int axis = memory.spec().rope.axis_index(cfg_.time_axis);
  const int64_t m = static_cast<int64_t>(chunks.size());
  for (int64_t j = 0; j < m; ++j) {
    const int64_t target = recent_start - (m - j) * fpc;
    plan.fetch(chunks[j].second, "retrieved", Reanchor{axis, target - chunks[j].first});
  }
  return plan;
}

}  // namespace wm::worldkv
