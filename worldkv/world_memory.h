#pragma once
// The world memory: assembles, chunk by chunk, the window [sink | retrieved | recent] that the
// model attends to while it denoises the next chunk (the denoise region: the current chunk's
// own tokens, staged after the window), and keeps what leaves it. Usage per chunk:
//   prepare(i, poses of chunk i's frames)   -> window() holds the context for chunk i
//   ... the model denoises chunk i over window() ...
//   commit(i, refill K/V of chunk i, poses) -> chunk i enters recent; the oldest recent chunk
//                                              leaves: dropped, or (compressed and) banked
// What goes where is the policy's plan (MemoryConfig::policy, worldkv/policies/); the memory
// (runtime/memory.h) carries it out. Each chunk's block carries its metadata: kind "chunk",
// created = its index, and a ChunkPayload (mean pose, first frame).
#include <memory>
#include <string>
#include <vector>

#include "runtime/block_store.h"
#include "runtime/memory.h"
#include "runtime/window.h"
#include "worldkv/chunk_payload.h"
#include "worldkv/compression.h"
#include "worldkv/memory_config.h"
#include "worldkv/policy.h"
#include "worldkv/pose.h"
#include "worldkv/pose_index.h"
#include "worldkv/video_policy.h"

namespace wm::worldkv {

// Which chunks of a rollout make the window when chunk `target` is prepared, chunks 0 .. target-1
// having been committed in order: the policy's region capacities applied to chunk indices, with
// no tensors. The memory itself assembles exactly these regions (WorldMemory::prepare); the
// trainer shapes its samples by them and the viewer shows the retrieved region's capacity, so a
// change of the config reaches all three alike.
struct WindowChunks {
  std::vector<int64_t> sink;    // chunks in the sink, oldest first
  std::vector<int64_t> banked;  // chunks in the bank, oldest first: what retrieval chooses from
                                // (empty for a policy that drops what leaves recent)
  int retrieved_slots = 0;      // most chunks the retrieved region holds (0: none); with
                                // fill_by_tokens its token budget over a compressed chunk's tokens
  std::vector<int64_t> recent;  // chunks in recent, oldest first
};

// The window of chunk `target` (>= 0) for a memory configured by cfg. Throws wm::Error on a bad
// config (as WorldMemory does: tokens_per_frame must be set) or a negative target.
WindowChunks window_chunks(const MemoryConfig& cfg, int64_t target);

class WorldMemory {
 public:
  // Throws wm::Error on a bad config or spec, or an unknown policy (listing the registered ones).
  WorldMemory(KvSpec spec, MemoryConfig cfg);

  // Sets up the window for chunk `index`, whose frames will have `poses`: for the retrieval
  // policies, the nearest banked chunks fill the retrieved region (copied from the bank,
  // re-anchored if so configured). Chunks must come in order 0, 1, 2, ...
  void prepare(int64_t index, const std::vector<Pose>& poses);
  // Takes chunk `index`'s refill K/V (per layer: k rotated, v, pos [n, n_axes]; logw may be
  // undefined) and its frames' poses; evicts what no longer fits.
  void commit(int64_t index, std::vector<LayerKv> kv, const std::vector<Pose>& poses);

  // The window, for staging the current chunk's tokens and attention views (its contents change
  // through prepare() and commit() only).
  KvWindow& window() { return memory_->window(); }
  const KvWindow& window() const { return memory_->window(); }
  const MemoryConfig& config() const { return cfg_; }
  const BlockStore& bank() const { return memory_->bank(); }
  // Retrievals skipped because the bank's remote tier lost the chunk (KvMemory::lost_fetches).
  int64_t lost_fetches() const { return memory_->lost_fetches(); }
  const VideoPolicy& policy() const { return *policy_; }
  // window_chunks(config(), target), from this memory's own policy.
  WindowChunks window_chunks(int64_t target) const;

  // Chunk ids per region in window order, e.g. {"sink": ["chunk:0"], ...}.
  std::vector<std::string> region_ids(const std::string& region) const;
  // Chunks retrieved for the current chunk (nearest first) and their distances.
  const std::vector<Scored>& last_retrieval() const { return policy_->last_retrieval(); }
  // Mean pose of every chunk committed so far, by chunk index (for minimaps and plots).
  const std::vector<Pose>& chunk_poses() const { return chunk_poses_; }
  // Bytes of the window (allocated) and the largest it has been.
  size_t window_bytes() const { return memory_->window().bytes_allocated(); }
  size_t peak_window_bytes() const { return peak_window_bytes_; }
  static std::string chunk_id(int64_t index);

 private:
  // The metadata of chunk `index`, whose frames have `poses`.
  BlockMeta chunk_meta(int64_t index, const std::vector<Pose>& poses) const;

  KvSpec spec_;
  MemoryConfig cfg_;
  std::unique_ptr<VideoPolicy> policy_;
  std::unique_ptr<KvMemory> memory_;
  std::vector<Pose> chunk_poses_;
  int64_t next_index_ = 0;
  size_t peak_window_bytes_ = 0;
};

}  // namespace wm::worldkv
