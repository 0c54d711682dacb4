// keepkv: KeepKV. Every window entry carries a vote count p (the core's log-weight, log p; a
// fresh token has one vote). A layer over budget merges its lowest-scoring entries, the last
// `recent` excluded, each into the kept entry whose key is most similar (cosine over the kv
// heads), by ZIP-merging (llmkv/merge.h): votes add up, and for the step's last query the
// attention output is what it was before the merge. Scores are an exponential moving average of
// the attention each entry received (the step's mean over its queries, summed over heads),
// bias-corrected for the steps an entry has seen; a merged entry scores the sum of its members.
// keepkv_ev, the ablation: the same votes and choices, keys and values vote-weighted means.
#include <cmath>

#include "llmkv/merge.h"
#include "llmkv/text_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class KeepKv final : public TextPolicy {
 public:
  KeepKv(const TextMemoryConfig& cfg, MergeRule rule) : TextPolicy(cfg), rule_(rule) {
    recent_ = cfg.recent > 0 ? cfg.recent : cfg.budget / 4;
    WM_CHECK(recent_ < cfg.budget - cfg.slack, name(), " needs a KV budget (less slack) above its ", recent_,
             " recent tokens, got ", cfg.budget - cfg.slack);
  }

  StepNeeds step_needs() const override { return {true, 0, true}; }

  MemoryPlan observe(const KvMemory& memory, const StepView& step) override {
    const KvWindow& w = memory.window();
    const int L = w.spec().n_layers;
    WM_CHECK(static_cast<int>(step.key_mass.size()) == L && static_cast<int>(step.query.size()) == L, name(),
             " needs the key mass and the last query of all ", L, " layers");
    const double beta = cfg_.score_decay;
    const double scale = 1.0 / std::sqrt(static_cast<double>(w.spec().head_dim));
    ema_.resize(L);
    seen_.resize(L);
    MemoryPlan plan;
    for (int l = 0; l < L; ++l) {
      const int64_t n = w.size(l), fresh = step.fresh, before = n - fresh;
      const at::Tensor& mass = step.key_mass[l];
      WM_CHECK(mass.dim() == 2 && mass.size(1) == n, "layer ", l, ": key mass ", mass.sizes(), " for ", n, " keys");
      if (!ema_[l].defined() || ema_[l].size(0) != before) {
        ema_[l] = at::zeros({before}, at::kDouble);
        seen_[l] = at::zeros({before}, at::kDouble);
      }
      const at::Tensor m = mass.sum(0).to(at::kCPU, at::kDouble) / static_cast<double>(fresh);
      at::Tensor ema = at::cat({ema_[l], at::zeros({fresh}, at::kDouble)}) * beta + m * (1.0 - beta);
      at::Tensor seen = at::cat({seen_[l], at::zeros({fresh}, at::kDouble)}) + 1.0;
      if (n > cfg_.budget) merge_layer(w, l, step.query[l], scale, ema, seen, plan);
      ema_[l] = ema;
      seen_[l] = seen;
    }
    return plan;
  }

  void reset() override { ema_.clear(), seen_.clear(); }

 private:
  // Plans layer l's merge down to the budget and leaves ema/seen as the kept entries' state.
  void merge_layer(const KvWindow& w, int l, const at::Tensor& q, double scale, at::Tensor& ema, at::Tensor& seen,
                   MemoryPlan& plan) const {
    const int64_t n = w.size(l), excess = n - evict_to(), cand = n - recent_;
    // Bias-corrected scores of the candidates; the lowest `excess` go.
    const at::Tensor score = ema / (1.0 - at::pow(cfg_.score_decay, seen));
    std::vector<int64_t> keep = keep_top_and_recent(score.narrow(0, 0, cand), cand - excess, n, recent_);
    std::vector<bool> kept(n, false);
    for (int64_t i : keep) kept[i] = true;
    std::vector<int64_t> sources, targets;  // targets: the kept candidates
    for (int64_t i = 0; i < cand; ++i) (kept[i] ? targets : sources).push_back(i);
    // Each source joins the kept candidate with the most similar key (cosine over all kv heads).
    const at::Tensor keys = w.k(l).to(at::kCPU, at::kFloat).permute({1, 0, 2}).reshape({n, -1});
    const at::Tensor unit = keys / keys.norm(2, 1, true).clamp_min(1e-12);
    const at::Tensor ti = at::tensor(targets, at::kLong), si = at::tensor(sources, at::kLong);
    const at::Tensor best = unit.index_select(0, si).matmul(unit.index_select(0, ti).t()).argmax(1);
    std::vector<int64_t> group(n, -1);
    for (size_t g = 0; g < keep.size(); ++g) group[keep[g]] = static_cast<int64_t>(g);
    const auto* b = best.data_ptr<int64_t>();
    for (size_t s = 0; s < sources.size(); ++s) group[sources[s]] = group[targets[b[s]]];
    const int64_t G = static_cast<int64_t>(keep.size());
    // Merge only what changes: the sources and the kept entries they join (groups of one come
    // out as they went in, so the rest of the layer need not be touched).
    std::vector<int64_t> local(G, -1), written, sub;
    for (int64_t src : sources)
      if (local[group[src]] < 0) {
        local[group[src]] = static_cast<int64_t>(written.size());
        written.push_back(keep[group[src]]);
      }
    std::vector<int64_t> sub_group;
    for (int64_t i = 0; i < n; ++i)
      if (group[i] >= 0 && local[group[i]] >= 0) sub.push_back(i), sub_group.push_back(local[group[i]]);
    const at::Tensor si_dev = at::tensor(sub, at::kLong).to(w.k(l).device());
    const MergedKv merged =
        merge_groups(w.k(l).index_select(1, si_dev), w.v(l).index_select(1, si_dev),
                     w.logw(l).index_select(0, si_dev), sub_group, static_cast<int64_t>(written.size()),
                     q.to(w.k(l).device()), scale, rule_);
    plan.write(l, written, merged.k, merged.v, merged.logw);
    // A merged entry scores what its members scored, and has been seen as long as its target.
    const at::Tensor gi_all = at::tensor(group, at::kLong);
    at::Tensor ema_g = at::zeros({G}, at::kDouble).index_add_(0, gi_all, ema);
    const at::Tensor ki = at::tensor(keep, at::kLong);
    seen = seen.index_select(0, ki);
    ema = ema_g;
    plan.keep(l, std::move(keep));
  }

  MergeRule rule_;
  int64_t recent_;
  std::vector<at::Tensor> ema_, seen_;  // per layer, per window entry (CPU, float64)
};

}  // namespace

std::unique_ptr<TextPolicy> make_keepkv(const TextMemoryConfig& cfg) {
  return std::make_unique<KeepKv>(cfg, MergeRule::Zip);
}
std::unique_ptr<TextPolicy> make_keepkv_ev(const TextMemoryConfig& cfg) {
  return std::make_unique<KeepKv>(cfg, MergeRule::Votes);
}

}  // namespace wm::llm
