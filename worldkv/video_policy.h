#pragma once
// The video path's memory policies (runtime/memory.h's MemoryPolicy), in chunks. Every one puts
// each new chunk in the sink until the sink is full, then at the end of recent, and when recent
// holds more chunks than it may, its oldest leaves: dropped, or banked for retrieval. The
// policies themselves are small classes in worldkv/policies/, one per file, made by name.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/memory.h"
#include "worldkv/memory_config.h"
#include "worldkv/pose_index.h"

namespace wm::worldkv {

class VideoPolicy : public MemoryPolicy {
 public:
  std::vector<std::string> regions() const override { return regions_; }
  // Nothing to bring back: clears last_retrieval().
  MemoryPlan prepare(const KvMemory& memory, const BlockMeta& next) override;
  // Inserts the chunk (its metadata carries a ChunkPayload) into the sink while it has room,
  // else into recent, evicting recent's oldest chunks beyond its capacity (evict()).
  MemoryPlan admit(const KvMemory& memory, Block chunk) override;

  // Whether evicted chunks go to the bank (and can come back).
  virtual bool banks() const { return false; }
  // The chunks the last prepare() chose (best first) and their distances; empty when it chose none.
  const std::vector<Scored>& last_retrieval() const { return last_retrieval_; }
  // Capacities in chunks; recent_capacity() < 0: unbounded.
  int sink_capacity() const { return sink_; }
  int retrieved_capacity() const { return retrieved_; }
  int recent_capacity() const { return recent_; }

 protected:
  // regions: in window order, from "sink", "retrieved", "recent". Throws wm::Error if recent
  // holds no chunk.
  VideoPolicy(const MemoryConfig& cfg, std::vector<std::string> regions, int sink_chunks, int retrieved_chunks,
              int recent_chunks);
  // What becomes of chunk `id` (in the window, with `meta`) when it leaves recent: dropped here.
  virtual void evict(const std::string& id, const BlockMeta& meta, MemoryPlan& plan);

  MemoryConfig cfg_;
  std::vector<Scored> last_retrieval_;

 private:
  std::vector<std::string> regions_;
  int sink_ = 0, retrieved_ = 0, recent_ = 0;
};

// The retrieval policies, [sink | retrieved | recent]: evicted chunks are banked (compressed
// first if compressor() says so) and indexed by pose; before each chunk the retrieved region
// is refilled with the banked chunks pick() ranks first, at their original positions or
// re-anchored just before recent (MemoryConfig::placement).
class RetrievalPolicy : public VideoPolicy {
 public:
  MemoryPlan prepare(const KvMemory& memory, const BlockMeta& next) override;
  bool banks() const override { return true; }

 protected:
  RetrievalPolicy(const MemoryConfig& cfg, int retrieved_chunks);
  // The banked chunks to retrieve for the chunk `next` describes, best first, at most k: the
  // nearest by camera pose here (PoseIndex).
  virtual std::vector<Scored> pick(const KvMemory& memory, const BlockMeta& next, size_t k) const;
  // What the bank keeps of an evicted chunk; empty: the chunk as it is.
  virtual std::function<Block(const Block&)> compressor() const { return {}; }
  void evict(const std::string& id, const BlockMeta& meta, MemoryPlan& plan) override;

  PoseIndex index_;  // the banked chunks' poses

 private:
  MemoryPlan refill(const KvMemory& memory, const BlockMeta& next, const std::vector<Scored>& picks) const;
};

// The policy cfg.policy names, for cfg. Throws wm::Error listing the registered names if none is
// registered under it, or if cfg does not suit the policy.
std::unique_ptr<VideoPolicy> make_policy(const MemoryConfig& cfg);

}  // namespace wm::worldkv
