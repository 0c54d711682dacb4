// prefix_cache: LMCache's prefix reuse at segment granularity. Every reusable segment's K/V, as
// computed inside a prompt, is stored under a key chained over the segments before it; the next
// prompt reuses the longest run of leading segments whose keys are found (exactly: same tokens at
// the same positions after the same prefix) and prefills the rest after it. A changed segment
// ends the reuse: everything after it is computed again.
#include "llmkv/recompute/recompute_policy.h"

namespace wm::llm {
namespace {

class PrefixCache final : public RecomputePolicy {
 public:
  using RecomputePolicy::RecomputePolicy;
  RecomputePlan prepare(const std::vector<PromptSegment>& prompt, ChunkCache& cache) override {
    std::vector<std::vector<int64_t>> ids;
    for (const auto& s : prompt) ids.push_back(s.ids);
    const std::vector<ChunkKey> keys = cache.prefix_keys(ids);
    const std::vector<int64_t> off = segment_offsets(prompt);
    RecomputePlan plan;
    plan.prefill_rest = true;
    plan.store_prefixes = true;
    for (size_t s = 0; s < prompt.size(); ++s) {
      if (prompt[s].ids.empty()) continue;
      if (!prompt[s].reusable || !cache.lookup(keys[s])) break;
      CacheUnit u;
      u.first = static_cast<int>(s);
      u.last = static_cast<int>(s) + 1;
      u.begin = off[s];
      u.end = off[s + 1];
      u.key = keys[s];
      u.kind = "prefix";
      u.exact = true;
      plan.units.push_back(u);
    }
    return plan;
  }
};

}  // namespace

std::unique_ptr<RecomputePolicy> make_prefix_cache(const RecomputeConfig& cfg) {
  return std::make_unique<PrefixCache>(cfg);
}

}  // namespace wm::llm
