// full_reuse: every reusable segment from its own chunk entry, re-anchored, nothing recomputed
// (only layer 0, whose K/V do not depend on the context). What each segment would have taken from
// the ones before it is lost.
#include "llmkv/recompute/recompute_policy.h"

namespace wm::llm {
namespace {

class FullReuse final : public RecomputePolicy {
 public:
  using RecomputePolicy::RecomputePolicy;
  RecomputePlan prepare(const std::vector<PromptSegment>& prompt, ChunkCache& cache) override {
    RecomputePlan plan;
    plan.units = segment_units(prompt, cache);
    plan.check_layers = {0};
    plan.balanced_loading = cfg_.balanced_loading;
    return plan;
  }
  std::vector<int64_t> select(const BlendLayer&) override { return {}; }
};

}  // namespace

std::unique_ptr<RecomputePolicy> make_full_reuse(const RecomputeConfig& cfg) {
  return std::make_unique<FullReuse>(cfg);
}

}  // namespace wm::llm
