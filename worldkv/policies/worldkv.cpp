// worldkv: [sink | retrieved | recent]; chunks leaving recent are banked whole, and before each
// chunk the retrieved region holds the banked chunks nearest to its camera pose (WorldKV's
// World Retrieval).
#include "worldkv/video_policy.h"

namespace wm::worldkv {
namespace {

class WorldKv final : public RetrievalPolicy {
 public:
  explicit WorldKv(const MemoryConfig& cfg) : RetrievalPolicy(cfg, cfg.chunks(cfg.retrieved_frames)) {}
};

}  // namespace

std::unique_ptr<VideoPolicy> make_worldkv(const MemoryConfig& cfg) { return std::make_unique<WorldKv>(cfg); }

}  // namespace wm::worldkv
