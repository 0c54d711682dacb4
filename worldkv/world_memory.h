#pragma once
// The world memory: assembles, chunk by chunk, the window [sink | retrieved | recent] that the
// model attends to while it denoises the next chunk (the denoise region: the current chunk's
// own tokens, staged after the window), and keeps what leaves it. Usage per chunk:
//   prepare(i, poses of chunk i's frames)   -> window() holds the context for chunk i
//   ... the model denoises chunk i over window() ...
//   commit(i, refill K/V of chunk i, poses) -> chunk i enters recent; the oldest recent chunk
//                                              leaves: dropped, or (compressed and) banked
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/block_store.h"
#include "runtime/window.h"
#include "worldkv/compression.h"
#include "worldkv/policy.h"
#include "worldkv/pose.h"
#include "worldkv/pose_index.h"

namespace wm::worldkv {

struct MemoryConfig {
  int frames_per_chunk = 3;
  int sink_frames = 3;
  int retrieved_frames = 9;
  int recent_frames = 3;
  int denoise_frames = 3;
  int64_t tokens_per_frame = 0;  // latent tokens per frame (required)
  Policy policy = Policy::WorldKv;
  Placement placement = Placement::Original;
  CompressionConfig compression;
  // worldkv_c: the retrieved region is filled by its token budget (retrieved_frames x
  // tokens_per_frame) with compressed chunks, so it holds more of them than worldkv does.
  bool fill_by_tokens = false;
  StoreConfig bank;  // tiers and budgets of the bank
  std::string time_axis = "t";

  // Throws wm::Error unless sizes are whole chunks and tokens_per_frame > 0.
  void validate() const;
  int chunks(int frames) const { return frames / frames_per_chunk; }
};

class WorldMemory {
 public:
  WorldMemory(KvSpec spec, MemoryConfig cfg);

  // Sets up the window for chunk `index`, whose frames will have `poses`: for the retrieval
  // policies, the nearest banked chunks fill the retrieved region (copied from the bank,
  // re-anchored if so configured). Chunks must come in order 0, 1, 2, ...
  void prepare(int64_t index, const std::vector<Pose>& poses);
  // Takes chunk `index`'s refill K/V (per layer: k rotated, v, pos [n, n_axes]; logw may be
  // undefined) and its frames' poses; evicts what no longer fits.
  void commit(int64_t index, std::vector<LayerKv> kv, const std::vector<Pose>& poses);

  KvWindow& window() { return *window_; }
  const KvWindow& window() const { return *window_; }
  const MemoryConfig& config() const { return cfg_; }
  const BlockStore& bank() const { return *bank_; }

  // Chunk ids per region in window order, e.g. {"sink": ["chunk:0"], ...}.
  std::vector<std::string> region_ids(const std::string& region) const;
  // Chunks retrieved for the current chunk (nearest first) and their distances.
  const std::vector<Scored>& last_retrieval() const { return last_retrieval_; }
  // Mean pose of every chunk committed so far, by chunk index (for minimaps and plots).
  const std::vector<Pose>& chunk_poses() const { return chunk_poses_; }
  // Bytes of the window (allocated) and the largest it has been.
  size_t window_bytes() const { return window_->bytes_allocated(); }
  size_t peak_window_bytes() const { return peak_window_bytes_; }
  static std::string chunk_id(int64_t index);

 private:
  void evict_oldest_recent();
  void rebuild_retrieved(int64_t index, const std::vector<Scored>& picks);
  std::vector<Scored> pick_by_attention(size_t k) const;
  int64_t first_frame_of(const std::string& id) const;
  size_t region_ids_size(const std::string& region) const {
    return window_->layout().segments(window_->layout().region(region)).size();
  }

  KvSpec spec_;
  MemoryConfig cfg_;
  std::unique_ptr<KvWindow> window_;
  std::unique_ptr<BlockStore> bank_;
  PoseIndex index_;
  std::vector<Pose> chunk_poses_;
  std::vector<Scored> last_retrieval_;
  std::unordered_map<std::string, BlockMeta> window_meta_;  // metadata of chunks in sink/recent
  int64_t next_index_ = 0;
  int sink_cap_ = 0, recent_cap_ = 0, retrieved_cap_ = 0;  // in chunks; recent_cap_ < 0: unbounded
  int time_axis_ = 0;
  size_t peak_window_bytes_ = 0;
};

}  // namespace wm::worldkv
