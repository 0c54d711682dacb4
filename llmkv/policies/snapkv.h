#pragma once
// SnapKV's selection, shared by snapkv (one budget for every layer), pyramidkv (budgets that
// shrink from the lower to the upper layers) and adakv (per-head budgets under each layer's).
#include "llmkv/text_policy.h"

namespace wm::llm {

// At the end of a prefill step the last `window` queries vote for the keys before them (their
// attention mass, max-pooled over `kernel` neighbouring keys per kv head). A layer over its
// budget keeps the window's own tokens (at most half its budget) and the keys with the most
// votes: per kv head, each head its own keys (as published; KvWindow::keep_tokens_per_head), or,
// pooled ("snapkv_layer", "pyramidkv_layer"), the votes summed over the heads and one token set
// for the layer. Decoded tokens are kept: SnapKV compresses the prompt.
class SnapKv : public TextPolicy {
 public:
  bool stateless() const override { return true; }
  SnapKv(const TextMemoryConfig& cfg, bool per_head);
  StepNeeds step_needs() const override { return {true, cfg_.window, false}; }
  MemoryPlan observe(const KvMemory& memory, const StepView& step) override;

 protected:
  // Tokens each layer keeps (per kv head when selecting per head).
  virtual std::vector<int64_t> budgets(int n_layers) const { return std::vector<int64_t>(n_layers, cfg_.budget); }
  // How many of the candidates each kv head keeps, given their pooled votes [KH, m] (-inf: a
  // token the head no longer sees) and the layer's per-head share k: k each (SnapKV).
  virtual std::vector<int64_t> head_shares(const at::Tensor& votes, int64_t k) const;

  bool per_head_;
};

// Per kv head h: the top shares[h] of votes[h] (a [KH, m] float tensor over tokens [0, m), -inf
// never chosen) joined by the tokens [n - recent, n); each list strictly increasing, ties to the
// earlier token.
std::vector<std::vector<int64_t>> keep_top_and_recent_per_head(const at::Tensor& votes,
                                                               const std::vector<int64_t>& shares, int64_t n,
                                                               int64_t recent);

}  // namespace wm::llm
