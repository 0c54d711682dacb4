// full_recompute: the whole prompt prefilled, nothing taken from the cache: the quality reference.
#include "llmkv/recompute/recompute_policy.h"

namespace wm::llm {
namespace {

class FullRecompute final : public RecomputePolicy {
 public:
  using RecomputePolicy::RecomputePolicy;
  RecomputePlan prepare(const std::vector<PromptSegment>&, ChunkCache&) override {
    RecomputePlan plan;
    plan.prefill_rest = true;
    return plan;
  }
};

}  // namespace

std::unique_ptr<RecomputePolicy> make_full_recompute(const RecomputeConfig& cfg) {
  return std::make_unique<FullRecompute>(cfg);
}

}  // namespace wm::llm
