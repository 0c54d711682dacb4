// snapkv: SnapKV (see snapkv.h), one budget for every layer.
#include "llmkv/policies/snapkv.h"

#include <ATen/ops/max_pool1d.h>

#include <algorithm>

#include "runtime/error.h"

namespace wm::llm {

SnapKv::SnapKv(const TextMemoryConfig& cfg) : TextPolicy(cfg) {
  // Named by the policy asked for (pyramidkv shares this constructor), not by the class.
  if (cfg.budget < 2)
    throw Error(str_cat("policy ", cfg.policy, " needs a KV budget of at least 2 tokens, got ", cfg.budget));
}

MemoryPlan SnapKv::observe(const KvMemory& memory, const StepView& step) {
  const std::vector<at::Tensor>& mass = step.key_mass;
  const int64_t fresh = step.fresh;
  MemoryPlan plan;
  if (fresh <= 1) return plan;
  const KvWindow& w = memory.window();
  const int L = w.spec().n_layers;
  WM_CHECK(static_cast<int>(mass.size()) == L, name(), " needs the key mass of all ", L, " layers, got ",
           mass.size());
  const std::vector<int64_t> budget = budgets(L);
  for (int l = 0; l < L; ++l) {
    const int64_t n = w.size(l);
    if (n <= budget[l]) continue;
    WM_CHECK(mass[l].dim() == 2 && mass[l].size(1) == n, "layer ", l, ": key mass ", mass[l].sizes(), " for ", n,
             " keys");
    const int64_t obs = std::max<int64_t>(1, std::min({cfg_.window, fresh, budget[l] / 2}));
    // Votes for the keys before the window, pooled per kv head so that a kept key brings its
    // neighbours' context along.
    at::Tensor votes = mass[l].narrow(1, 0, n - obs).to(at::kFloat).unsqueeze(0);  // [1, KH, n - obs]
    at::Tensor pooled = at::max_pool1d(votes, {cfg_.kernel}, {1}, {cfg_.kernel / 2}).squeeze(0).sum(0);
    plan.keep(l, keep_top_and_recent(pooled, budget[l] - obs, n, obs));
  }
  return plan;
}

std::unique_ptr<TextPolicy> make_snapkv(const TextMemoryConfig& cfg) { return std::make_unique<SnapKv>(cfg); }

}  // namespace wm::llm
