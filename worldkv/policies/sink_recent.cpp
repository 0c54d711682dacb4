// sink_recent: [sink | recent], the first chunks kept in the sink, FIFO over the rest (recent
// takes the retrieved region's frames too); what leaves is dropped.
#include "worldkv/video_policy.h"

namespace wm::worldkv {
namespace {

class SinkRecent final : public VideoPolicy {
 public:
  explicit SinkRecent(const MemoryConfig& cfg)
      : VideoPolicy(cfg, {"sink", "recent"}, cfg.chunks(cfg.sink_frames), 0,
                    cfg.chunks(cfg.retrieved_frames + cfg.recent_frames)) {}
};

}  // namespace

std::unique_ptr<VideoPolicy> make_sink_recent(const MemoryConfig& cfg) { return std::make_unique<SinkRecent>(cfg); }

}  // namespace wm::worldkv
