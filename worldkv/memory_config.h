#pragma once
// The world memory's configuration: region sizes in frames, the policy by name, placement of
// retrieved chunks, compression, the bank's tiers.
#include <cstdint>
#include <string>

#include "runtime/block_store.h"
#include "worldkv/compression.h"
#include "worldkv/policy.h"

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
  // A folder: the window's K/V live in files there (runtime/mapped_storage.h), paged to disk by
  // the kernel when memory runs short (a window larger than memory, LingBot-World-Fast at full
  // width); empty: in memory.
  std::string kv_files_dir;
  std::string time_axis = "t";

  // Throws wm::Error unless sizes are whole chunks and tokens_per_frame > 0.
  void validate() const;
  int chunks(int frames) const { return frames / frames_per_chunk; }
};

}  // namespace wm::worldkv
