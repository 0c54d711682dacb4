// worldkv_attn: worldkv with retrieval by query-key importance instead of camera pose. Each
// chunk carries, as its metadata's embedding, its mean key per layer and head [L, H, d]; the
// probe is the same summary of the most recent chunk in the window (its keys stand in for the
// next chunk's queries, which do not exist before it is denoised), and a banked chunk scores
// sum over layers and heads of probe . summary / sqrt(d).
#include <algorithm>
#include <cmath>

#include "worldkv/video_policy.h"

namespace wm::worldkv {
namespace {

class WorldKvAttn final : public RetrievalPolicy {
 public:
  explicit WorldKvAttn(const MemoryConfig& cfg) : RetrievalPolicy(cfg, cfg.chunks(cfg.retrieved_frames)) {}

  MemoryPlan admit(const KvMemory& memory, Block chunk) override {
    std::vector<at::Tensor> summary;
    for (auto& l : chunk.layers) summary.push_back(l.k.to(at::kFloat).mean(1).to(at::kCPU));
    chunk.meta.embedding = at::stack(summary);  // [L, H, d]
    return RetrievalPolicy::admit(memory, std::move(chunk));
  }

 protected:
  std::vector<Scored> pick(const KvMemory& memory, const BlockMeta&, size_t k) const override {
    const KvWindow& window = memory.window();
    const auto& lay = window.layout();
    const auto& recent = lay.segments(lay.region("recent"));
    if (recent.empty()) return {};
    const std::string& pid = recent.back().id;
    std::vector<at::Tensor> probe;
    for (int l = 0; l < memory.spec().n_layers; ++l)
      probe.push_back(window.k(l)
                          .narrow(1, lay.segment_begin(l, pid), lay.segment_len(l, pid))
                          .to(at::kFloat)
                          .mean(1)
                          .to(at::kCPU));
    at::Tensor p = at::stack(probe);  // [L, H, d]
    const double scale = std::sqrt(static_cast<double>(memory.spec().head_dim));
    std::vector<Scored> out;
    for (auto& id : memory.bank().ids()) {
      const at::Tensor e = memory.bank().meta(id).embedding;
      const double s = (p * e).sum().item<double>() / scale;
      out.push_back({id, -s});
    }
    std::stable_sort(out.begin(), out.end(), [](const Scored& a, const Scored& b) { return a.distance < b.distance; });
    if (out.size() > k) out.resize(k);
    return out;
  }
};

}  // namespace

std::unique_ptr<VideoPolicy> make_worldkv_attn(const MemoryConfig& cfg) { return std::make_unique<WorldKvAttn>(cfg); }

}  // namespace wm::worldkv
