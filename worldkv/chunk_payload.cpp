#include "worldkv/chunk_payload.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/error.h"

namespace wm::worldkv {

namespace {
// Spill files written by the world memory read back with their chunk payloads.
[[maybe_unused]] const bool kRegistered = register_block_payload(ChunkPayload::kType, &ChunkPayload::from_json);
}  // namespace

nlohmann::json ChunkPayload::to_json() const {
  return {{"pose", to_vector(pose_)}, {"first_frame", first_frame_}};
}

std::shared_ptr<const BlockPayload> ChunkPayload::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("pose") || !j.contains("first_frame"))
    throw CorruptData("a chunk payload needs 'pose' and 'first_frame'");
  const auto& p = j["pose"];
  if (!p.is_array() || p.size() != 5 || !std::all_of(p.begin(), p.end(), [](const auto& v) { return v.is_number(); }))
    throw CorruptData(str_cat("a chunk payload's pose is 5 numbers (x, y, z, yaw, pitch), got ", p.dump()));
  if (!j["first_frame"].is_number_integer())
    throw CorruptData(str_cat("a chunk payload's first_frame is an integer, got ", j["first_frame"].dump()));
  return std::make_shared<ChunkPayload>(from_vector(p.get<std::vector<double>>()), j["first_frame"].get<int64_t>());
}

const ChunkPayload& chunk_payload(const BlockMeta& meta, const std::string& id) {
  const ChunkPayload* p = meta.payload_as<ChunkPayload>();
  WM_CHECK(p != nullptr, "block '", id, "' carries no chunk payload (pose, first frame)");
  return *p;
}

}  // namespace wm::worldkv
