// keep: KEEP's recompute for a memory that changes as the world does.
//  (1) Static-dynamic memory construction (keep_memory.h): segments unchanged for static_after
//      steps are grouped by similarity and cached as one block each; the rest one by one.
//  (2) Multi-hop recompute (multi_hop.h): at each check layer (default: layer 1, the first where
//      a query's attention has been through a layer of context; layer 0's follows only the words
//      a query shares with a line, and on the embedded 3-layer model selecting there costs 4
//      points of oracle agreement in wm_plan_bench's short layout against 0.5 at layer 1,
//      both without the head tokens below),
//      importance starts from the query's attention to each unit; the top ratio of the reused
//      tokens (times check_ratios[j] at the j-th check layer) is selected by whole units among
//      those still recomputed, their attention to the other units raises those units'
//      importance, and so on until the selection settles; the selected units are recomputed from
//      the next layer on, the others taken from the cache. The layers before the first check are
//      computed for every token of a unit not exact (the executor's rule), as CacheBlend's first.
//      A selected unit's attention to the others is its segments' last tokens' (each has read its
//      whole line): on a 2.4k-token memory that costs about 3 ms of a step against 10 for the
//      average over every token of the unit, with the same oracle agreement in wm_plan_bench.
//  (3) Layer-balanced loading: once a selection is made, the blocks every later layer needs are
//      known, and the loader may load them all ahead (balanced_loading) instead of a layer ahead.
// keep_no_grouping, keep_one_hop and keep_next_layer each switch one of the three off.
// Besides, the first head_tokens (2) tokens of every reused unit not selected stay recomputed: a
// unit prefilled alone from position 0 makes its first tokens that prefill's attention sink, and
// re-anchored into a longer prompt their K/V are among those that differ most from the prompt's
// own (as EPIC observes for position-independent caching). In wm_plan_bench's short layout (1,200
// episodes, 7,780 steps) keep without them is wrong where cacheblend is right on 57 steps and the
// reverse on 31 (p 0.007), with them on 37 and 29 (p 0.39). head_tokens = 0 is KEEP as published.
#include <algorithm>
#include <cmath>

#include "llmkv/recompute/keep_memory.h"
#include "llmkv/recompute/multi_hop.h"
#include "llmkv/recompute/recompute_policy.h"

namespace wm::llm {
namespace {

class Keep final : public RecomputePolicy {
 public:
  explicit Keep(RecomputeConfig cfg)
      : RecomputePolicy(std::move(cfg)),
        memory_(cfg_.static_after, cfg_.group_similarity, cfg_.max_group_tokens, cfg_.grouping) {}

  RecomputePlan prepare(const std::vector<PromptSegment>& prompt, ChunkCache& cache) override {
    KeepMemory::Construction c = memory_.construct(prompt, cache);
    RecomputePlan plan;
    plan.units = std::move(c.units);
    plan.build_after = std::move(c.builds);
    plan.check_layers = cfg_.check_layers;
    if (plan.check_layers.empty()) plan.check_layers = {std::max(0, std::min(1, cache.n_layers() - 2))};
    check_layers_ = plan.check_layers;
    offsets_ = segment_offsets(prompt);
    plan.balanced_loading = cfg_.balanced_loading;
    return plan;
  }

  std::vector<int64_t> select(const BlendLayer& view) override {
    const auto& units = view.units();
    const int U = static_cast<int>(units.size());
    // Units still recomputed whole are the candidates (at the first check layer: every unit that
    // is not exact).
    std::vector<int64_t> carried_of(U, 0);
    std::vector<int> unit_of(view.n_prompt(), -1);
    for (int u = 0; u < U; ++u)
      for (int64_t i = units[u].begin; i < units[u].end; ++i) unit_of[i] = u;
    for (int64_t i : view.recomputed()) carried_of[unit_of[i]] += 1;
    std::vector<char> candidate(U, 0);
    std::vector<int64_t> tokens(U, 0);
    int64_t reused = 0;
    for (int u = 0; u < U; ++u) {
      tokens[u] = units[u].n_tokens();
      candidate[u] = !units[u].exact && carried_of[u] == tokens[u];
      if (!units[u].exact) reused += tokens[u];
    }
    double share = cfg_.ratio;
    for (size_t j = 0; j < cfg_.check_ratios.size() && j < check_layers_.size(); ++j)
      if (check_layers_[j] == view.layer()) share *= cfg_.check_ratios[j];
    const int64_t budget = static_cast<int64_t>(std::ceil(std::min(1.0, share) * reused - 1e-9));
    // Attention received, summed per unit (index U collects the fresh tokens').
    at::Tensor unit_index = at::empty({view.n_prompt()}, at::kLong);
    for (int64_t i = 0; i < view.n_prompt(); ++i) unit_index.data_ptr<int64_t>()[i] = unit_of[i] >= 0 ? unit_of[i] : U;
    auto per_unit = [&](const at::Tensor& rows) {  // [g, n_prompt] -> g rows of U sums
      const at::Tensor sums =
          at::zeros({rows.size(0), U + 1}, at::kDouble).index_add_(1, unit_index, rows.to(at::kDouble)).contiguous();
      std::vector<std::vector<double>> out(rows.size(0));
      for (int64_t g = 0; g < rows.size(0); ++g) out[g].assign(sums.data_ptr<double>() + g * (U + 1),
                                                               sums.data_ptr<double>() + g * (U + 1) + U);
      return out;
    };
    const std::vector<double> direct = per_unit(view.attention_from({view.fresh()}))[0];
    std::vector<int> chosen;
    if (cfg_.multi_hop) {
      auto rows = [&](const std::vector<int>& from) {
        std::vector<std::vector<int64_t>> groups;
        for (int u : from) {
          std::vector<int64_t> g;  // the last token of each of the unit's segments
          for (int sg = units[u].first; sg < units[u].last; ++sg)
            if (offsets_[sg + 1] > offsets_[sg]) g.push_back(offsets_[sg + 1] - 1);
          groups.push_back(std::move(g));
        }
        return per_unit(view.attention_from(groups));
      };
      const MultiHopSelection sel = multi_hop_select(direct, tokens, candidate, budget, rows, cfg_.max_hops);
      chosen = sel.selected;
      last_hops_ = sel.hops;
    } else {
      chosen = top_within_budget(direct, tokens, candidate, budget);
      last_hops_ = 0;
    }
    std::vector<int64_t> keep;
    std::vector<char> whole(U, 0);
    for (int u : chosen) {
      whole[u] = 1;
      for (int64_t i = units[u].begin; i < units[u].end; ++i) keep.push_back(i);
    }
    // Every other reused unit keeps its first head_tokens tokens that are still recomputed.
    const std::vector<int64_t>& rec = view.recomputed();
    for (int u = 0; u < U && cfg_.head_tokens > 0; ++u) {
      if (units[u].exact || whole[u]) continue;
      const int64_t head_end = std::min(units[u].end, units[u].begin + cfg_.head_tokens);
      for (auto it = std::lower_bound(rec.begin(), rec.end(), units[u].begin); it != rec.end() && *it < head_end; ++it)
        keep.push_back(*it);
    }
    return keep;
  }

  void reset() override { memory_.reset(); }

 private:
  KeepMemory memory_;
  std::vector<int> check_layers_;
  std::vector<int64_t> offsets_;  // the prompt's segment offsets
  int last_hops_ = 0;
};

}  // namespace

std::unique_ptr<RecomputePolicy> make_keep(const RecomputeConfig& cfg) { return std::make_unique<Keep>(cfg); }

std::unique_ptr<RecomputePolicy> make_keep_no_grouping(const RecomputeConfig& cfg) {
  RecomputeConfig c = cfg;
  c.grouping = false;
  return std::make_unique<Keep>(c);
}

std::unique_ptr<RecomputePolicy> make_keep_one_hop(const RecomputeConfig& cfg) {
  RecomputeConfig c = cfg;
  c.multi_hop = false;
  return std::make_unique<Keep>(c);
}

std::unique_ptr<RecomputePolicy> make_keep_next_layer(const RecomputeConfig& cfg) {
  RecomputeConfig c = cfg;
  c.balanced_loading = false;
  return std::make_unique<Keep>(c);
}

}  // namespace wm::llm
