// cacheblend: CacheBlend's selective recompute. Chunk entries are placed re-anchored; layer 0 is
// computed for every reused token, so that at the first check layer (1) every token's fresh K/V
// can be compared with the cached ones. The tokens whose K/V deviate most (squared difference of K
// and V, summed over heads and channels) are kept for recompute: 2 x ratio of the reused tokens at
// the first check layer, shrinking linearly to ratio over the next filter_layers layers (gradual
// filtering: each choice among the previous one's tokens), then ratio for every later layer.
#include <cmath>

#include "llmkv/recompute/recompute_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class CacheBlend final : public RecomputePolicy {
 public:
  using RecomputePolicy::RecomputePolicy;

  RecomputePlan prepare(const std::vector<PromptSegment>& prompt, ChunkCache& cache) override {
    first_ = cfg_.check_layers.empty() ? 1 : cfg_.check_layers[0];
    WM_CHECK(first_ >= 1, "cacheblend's first check layer must be >= 1 (layer 0's cached K/V equal the fresh "
                          "ones), got ", first_);
    RecomputePlan plan;
    plan.units = segment_units(prompt, cache);
    for (int j = 0; j <= cfg_.filter_layers; ++j) plan.check_layers.push_back(first_ + j);
    plan.cached_of_recomputed = true;
    plan.balanced_loading = false;
    return plan;
  }

  std::vector<int64_t> select(const BlendLayer& view) override {
    const std::vector<int64_t>& rec = view.recomputed();
    if (rec.empty()) return {};
    int64_t reused = 0;  // tokens that may be recomputed at all
    for (const auto& u : view.units())
      if (!u.exact) reused += u.n_tokens();
    const int j = view.layer() - first_, F = cfg_.filter_layers;
    const double share = std::min(1.0, cfg_.ratio * (F > 0 ? 1.0 + static_cast<double>(F - j) / F : 1.0));
    const int64_t want = std::min<int64_t>(static_cast<int64_t>(rec.size()),
                                           static_cast<int64_t>(std::ceil(share * reused - 1e-9)));
    WM_CHECK(view.cached_k().defined(), "cacheblend needs the cached K/V of the recomputed tokens");
    const at::Tensor dk = (view.fresh_k().to(at::kFloat) - view.cached_k().to(at::kFloat)).pow(2).sum(at::IntArrayRef{0, 2});
    const at::Tensor dv = (view.fresh_v().to(at::kFloat) - view.cached_v().to(at::kFloat)).pow(2).sum(at::IntArrayRef{0, 2});
    const at::Tensor top = std::get<1>((dk + dv).to(at::kCPU).topk(want));
    std::vector<int64_t> keep;
    keep.reserve(want);
    const at::Tensor idx = top.contiguous();
    for (int64_t i = 0; i < want; ++i) keep.push_back(rec[idx.data_ptr<int64_t>()[i]]);
    return keep;
  }

 private:
  int first_ = 1;
};

}  // namespace

std::unique_ptr<RecomputePolicy> make_cacheblend(const RecomputeConfig& cfg) {
  return std::make_unique<CacheBlend>(cfg);
}

}  // namespace wm::llm
