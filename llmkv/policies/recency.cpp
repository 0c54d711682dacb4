// recency: keeps the last `budget` tokens of every layer (truncation from the front; with a
// slack, the last budget - slack once the budget is passed).
#include "llmkv/text_policy.h"

namespace wm::llm {
namespace {

class Recency final : public TextPolicy {
 public:
  bool stateless() const override { return true; }
  using TextPolicy::TextPolicy;

  MemoryPlan observe(const KvMemory& memory, const StepView&) override {
    MemoryPlan plan;
    const KvWindow& w = memory.window();
    for (int l = 0; l < w.spec().n_layers; ++l) {
      const int64_t n = w.size(l);
      if (n <= cfg_.budget) continue;
      const int64_t m = evict_to();
      std::vector<int64_t> keep(m);
      for (int64_t i = 0; i < m; ++i) keep[i] = n - m + i;
      plan.keep(l, std::move(keep));
    }
    return plan;
  }
};

}  // namespace

std::unique_ptr<TextPolicy> make_recency(const TextMemoryConfig& cfg) { return std::make_unique<Recency>(cfg); }

}  // namespace wm::llm
