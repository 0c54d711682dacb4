// The recompute policies by name, the config's checks, and the helpers the policies share. Adding
// one: a file in this folder with the class and its factory (make_<name>), the factory's
// declaration below, and its line in the table.
#include <cmath>
#include <utility>

#include "llmkv/recompute/recompute_policy.h"
#include "runtime/error.h"
#include "runtime/named_registry.h"

namespace wm::llm {

std::unique_ptr<RecomputePolicy> make_full_recompute(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_prefix_cache(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_full_reuse(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_cacheblend(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_keep(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_keep_no_grouping(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_keep_one_hop(const RecomputeConfig& cfg);
std::unique_ptr<RecomputePolicy> make_keep_next_layer(const RecomputeConfig& cfg);

namespace {

using Factory = std::unique_ptr<RecomputePolicy> (*)(const RecomputeConfig&);

const NamedFactories<Factory>& registry() {
  static const NamedFactories<Factory> table = {
      {"full_recompute", make_full_recompute}, {"prefix_cache", make_prefix_cache},
      {"full_reuse", make_full_reuse},         {"cacheblend", make_cacheblend},
      {"keep", make_keep},                     {"keep_no_grouping", make_keep_no_grouping},
      {"keep_one_hop", make_keep_one_hop},     {"keep_next_layer", make_keep_next_layer},
  };
  return table;
}

}  // namespace

void RecomputeConfig::validate() const {
  WM_CHECK(std::isfinite(ratio) && ratio > 0 && ratio <= 1, "ratio must be in (0, 1], got ", ratio);
  WM_CHECK(filter_layers >= 0, "filter_layers must be >= 0, got ", filter_layers);
  for (size_t i = 0; i < check_layers.size(); ++i) {
    WM_CHECK(check_layers[i] >= 0, "check_layers must be >= 0, got ", check_layers[i]);
    WM_CHECK(i == 0 || check_layers[i] > check_layers[i - 1], "check_layers must be increasing");
  }
  WM_CHECK(check_ratios.empty() || check_ratios.size() == check_layers.size(), "check_ratios (",
           check_ratios.size(), ") needs one entry per check layer (", check_layers.size(), ")");
  for (double m : check_ratios)
    WM_CHECK(std::isfinite(m) && m > 0, "check_ratios must be positive, got ", m);
  WM_CHECK(static_after >= 1, "static_after must be >= 1, got ", static_after);
  WM_CHECK(std::isfinite(group_similarity) && group_similarity >= -1 && group_similarity <= 1,
           "group_similarity must be in [-1, 1], got ", group_similarity);
  WM_CHECK(max_group_tokens >= 1, "max_group_tokens must be >= 1, got ", max_group_tokens);
  WM_CHECK(max_hops >= 1, "max_hops must be >= 1, got ", max_hops);
  WM_CHECK(head_tokens >= 0, "head_tokens must be >= 0, got ", head_tokens);
}

std::vector<std::string> recompute_policy_names() { return registered_names(registry()); }

std::unique_ptr<RecomputePolicy> make_recompute_policy(const RecomputeConfig& cfg) {
  const Factory make = find_registered(registry(), cfg.policy, "recompute policy");
  cfg.validate();
  return make(cfg);
}

std::vector<int64_t> segment_offsets(const std::vector<PromptSegment>& prompt) {
  std::vector<int64_t> off(prompt.size() + 1, 0);
  for (size_t s = 0; s < prompt.size(); ++s) off[s + 1] = off[s] + static_cast<int64_t>(prompt[s].ids.size());
  return off;
}

std::vector<CacheUnit> segment_units(const std::vector<PromptSegment>& prompt, const ChunkCache& cache) {
  const std::vector<int64_t> off = segment_offsets(prompt);
  std::vector<CacheUnit> units;
  for (size_t s = 0; s < prompt.size(); ++s) {
    if (!prompt[s].reusable || prompt[s].ids.empty()) continue;
    CacheUnit u;
    u.first = static_cast<int>(s);
    u.last = static_cast<int>(s) + 1;
    u.begin = off[s];
    u.end = off[s + 1];
    u.key = cache.chunk_key(prompt[s].ids);
    u.kind = "chunk";
    u.exact = u.begin == 0;
    units.push_back(u);
  }
  return units;
}

void check_prompt(const std::vector<PromptSegment>& prompt) {
  int64_t n = 0;
  for (const auto& s : prompt) n += static_cast<int64_t>(s.ids.size());
  WM_CHECK(n > 0, "the prompt has no tokens");
  size_t last = prompt.size();
  while (last > 0 && prompt[last - 1].ids.empty()) --last;
  WM_CHECK(!prompt[last - 1].reusable, "the prompt's last segment ('", prompt[last - 1].slot,
           "') must be fresh: its last token gives the logits");
}

}  // namespace wm::llm
