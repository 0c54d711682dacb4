#pragma once
// SnapKV's selection, shared by snapkv (one budget for every layer) and pyramidkv (budgets that
// shrink from the lower to the upper layers).
#include "llmkv/text_policy.h"

namespace wm::llm {

// At the end of a prefill step the last `window` queries vote for the keys before them (their
// attention mass, max-pooled over `kernel` neighbouring keys per kv head, summed over the
// heads); a layer over its budget keeps the window's own tokens (at most half its budget) and
// the keys with the most votes. Decoded tokens are kept: SnapKV compresses the prompt.
class SnapKv : public TextPolicy {
 public:
  bool stateless() const override { return true; }
  explicit SnapKv(const TextMemoryConfig& cfg);
  StepNeeds step_needs() const override { return {true, cfg_.window, false}; }
  MemoryPlan observe(const KvMemory& memory, const StepView& step) override;

 protected:
  // Tokens each layer keeps.
  virtual std::vector<int64_t> budgets(int n_layers) const { return std::vector<int64_t>(n_layers, cfg_.budget); }
};

}  // namespace wm::llm
