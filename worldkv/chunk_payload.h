#pragma once
// What the video path keeps with each chunk's block (BlockMeta::payload): the mean camera pose
// of its frames, by which the bank retrieves it, and its first frame, by which it is
// re-anchored. Spill files keep it as {"pose": [x, y, z, yaw, pitch], "first_frame": f}.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "runtime/block.h"
#include "worldkv/pose.h"

namespace wm::worldkv {

class ChunkPayload final : public BlockPayload {
 public:
  static constexpr const char* kType = "worldkv.chunk";

  ChunkPayload(Pose pose, int64_t first_frame) : pose_(pose), first_frame_(first_frame) {}
  const Pose& pose() const { return pose_; }
  int64_t first_frame() const { return first_frame_; }

  std::string type() const override { return kType; }
  nlohmann::json to_json() const override;
  // The payload from to_json()'s form; throws wm::CorruptData unless the pose has 5 numbers and
  // first_frame is an integer. Registered for kType (register_block_payload).
  static std::shared_ptr<const BlockPayload> from_json(const nlohmann::json& j);

 private:
  Pose pose_;
  int64_t first_frame_;
};

// The chunk payload of block `id`'s metadata. Throws wm::Error naming the block if it has none.
const ChunkPayload& chunk_payload(const BlockMeta& meta, const std::string& id);

}  // namespace wm::worldkv
