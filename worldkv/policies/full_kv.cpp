// full_kv: [sink | recent], never evicts; the window grows with the rollout (the baseline whose
// cost the others bound).
#include "worldkv/video_policy.h"

namespace wm::worldkv {
namespace {

class FullKv final : public VideoPolicy {
 public:
  explicit FullKv(const MemoryConfig& cfg) : VideoPolicy(cfg, {"sink", "recent"}, cfg.chunks(cfg.sink_frames), 0, -1) {}
};

}  // namespace

std::unique_ptr<VideoPolicy> make_full_kv(const MemoryConfig& cfg) { return std::make_unique<FullKv>(cfg); }

}  // namespace wm::worldkv
