// sliding_window: [recent] alone, FIFO over as many frames as worldkv's whole window
// (sink + retrieved + recent); what leaves is dropped.
#include "worldkv/video_policy.h"

namespace wm::worldkv {
namespace {

class SlidingWindow final : public VideoPolicy {
 public:
  explicit SlidingWindow(const MemoryConfig& cfg)
      : VideoPolicy(cfg, {"recent"}, 0, 0, cfg.chunks(cfg.sink_frames + cfg.retrieved_frames + cfg.recent_frames)) {}
};

}  // namespace

std::unique_ptr<VideoPolicy> make_sliding_window(const MemoryConfig& cfg) {
  return std::make_unique<SlidingWindow>(cfg);
}

}  // namespace wm::worldkv
