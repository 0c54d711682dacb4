// worldkv_c: worldkv with chunks compressed as they enter the bank (key-key, MemoryConfig's
// compression: WorldKV's World Compression). With fill_by_tokens the retrieved region holds as
// many compressed chunks as its token budget allows, more than worldkv's whole ones.
#include "worldkv/compression.h"
#include "worldkv/video_policy.h"

namespace wm::worldkv {
namespace {

int retrieved_chunks(const MemoryConfig& cfg) {
  if (!cfg.fill_by_tokens) return cfg.chunks(cfg.retrieved_frames);
  return static_cast<int>(static_cast<int64_t>(cfg.retrieved_frames) * cfg.tokens_per_frame /
                          compressed_token_count(cfg.frames_per_chunk, cfg.tokens_per_frame, cfg.compression));
}

class WorldKvC final : public RetrievalPolicy {
 public:
  explicit WorldKvC(const MemoryConfig& cfg) : RetrievalPolicy(cfg, retrieved_chunks(cfg)) {}

 protected:
  std::function<Block(const Block&)> compressor() const override {
    return [tpf = cfg_.tokens_per_frame, cc = cfg_.compression](const Block& chunk) {
      return compress_chunk(chunk, tpf, cc);
    };
  }
};

}  // namespace

std::unique_ptr<VideoPolicy> make_worldkv_c(const MemoryConfig& cfg) { return std::make_unique<WorldKvC>(cfg); }

}  // namespace wm::worldkv
