// snapkv: SnapKV (see snapkv.h), one budget for every layer; snapkv_layer: its votes pooled over
// the kv heads.
#include "llmkv/policies/snapkv.h"

#include <ATen/ops/max_pool1d.h>

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace wm::llm {

SnapKv::SnapKv(const TextMemoryConfig& cfg, bool per_head) : TextPolicy(cfg), per_head_(per_head) {
  // Named by the policy asked for (pyramidkv shares this constructor), not by the class.
  if (cfg.budget < 2)
    throw Error(str_cat("policy ", cfg.policy, " needs a KV budget of at least 2 tokens, got ", cfg.budget));
}

std::vector<int64_t> SnapKv::head_shares(const at::Tensor& votes, int64_t k) const {
  return std::vector<int64_t>(votes.size(0), k);
}

std::vector<std::vector<int64_t>> keep_top_and_recent_per_head(const at::Tensor& votes,
                                                               const std::vector<int64_t>& shares, int64_t n,
                                                               int64_t recent) {
  const int64_t KH = votes.size(0), m = votes.size(1);
  WM_CHECK(static_cast<int64_t>(shares.size()) == KH && m <= n - recent, "per-head selection: ", shares.size(),
           " shares for ", KH, " heads, ", m, " candidates before ", recent, " recent of ", n);
  const at::Tensor finite = votes.gt(-std::numeric_limits<float>::infinity()).sum(1).to(at::kCPU);
  std::vector<std::vector<int64_t>> keep(KH);
  for (int64_t h = 0; h < KH; ++h)  // -inf sorts last: taking no more than the finite votes never picks one
    keep[h] = keep_top_and_recent(votes[h], std::min(shares[h], finite[h].item<int64_t>()), n, recent);
  return keep;
}

MemoryPlan SnapKv::observe(const KvMemory& memory, const StepView& step) {
  const std::vector<at::Tensor>& mass = step.key_mass;
  const int64_t fresh = step.fresh;
  MemoryPlan plan;
  if (fresh <= 1) return plan;
  const KvWindow& w = memory.window();
  const int L = w.spec().n_layers;
  const int64_t KH = w.spec().n_kv_heads;
  WM_CHECK(static_cast<int>(mass.size()) == L, name(), " needs the key mass of all ", L, " layers, got ",
           mass.size());
  const std::vector<int64_t> budget = budgets(L);
  for (int l = 0; l < L; ++l) {
    const int64_t n = w.size(l);
    int64_t seen = n;  // the most tokens a head sees
    const at::Tensor hidden = w.head_logw(l);
    if (hidden.defined()) {
      seen = 0;
      for (int64_t h = 0; h < KH; ++h) seen = std::max(seen, w.visible(l, h));
    }
    if (seen <= budget[l]) continue;
    WM_CHECK(mass[l].dim() == 2 && mass[l].size(1) == n, "layer ", l, ": key mass ", mass[l].sizes(), " for ", n,
             " keys");
    const int64_t obs = std::max<int64_t>(1, std::min({cfg_.window, fresh, budget[l] / 2}));
    // Votes for the keys before the window, pooled per kv head so that a kept key brings its
    // neighbours' context along.
    at::Tensor votes = mass[l].narrow(1, 0, n - obs).to(at::kFloat).unsqueeze(0);  // [1, KH, n - obs]
    at::Tensor pooled = at::max_pool1d(votes, {cfg_.kernel}, {1}, {cfg_.kernel / 2}).squeeze(0);
    if (!per_head_) {
      plan.keep(l, keep_top_and_recent(pooled.sum(0), budget[l] - obs, n, obs));
      continue;
    }
    if (hidden.defined())  // a head never takes back a token it no longer sees
      pooled.masked_fill_(hidden.narrow(1, 0, n - obs).to(pooled.device()).le(kHiddenLogw / 2),
                          -std::numeric_limits<float>::infinity());
    plan.keep_per_head(l, keep_top_and_recent_per_head(pooled, head_shares(pooled, budget[l] - obs), n, obs));
  }
  return plan;
}

std::unique_ptr<TextPolicy> make_snapkv(const TextMemoryConfig& cfg) { return std::make_unique<SnapKv>(cfg, true); }
std::unique_ptr<TextPolicy> make_snapkv_layer(const TextMemoryConfig& cfg) {
  return std::make_unique<SnapKv>(cfg, false);
}

}  // namespace wm::llm
