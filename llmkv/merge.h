#pragma once
// Merging KV entries (KeepKV). Each window entry carries a vote count p (the core's log-weight,
// log p): attention weighs a key by p * exp(q.k * scale). Merging a group of entries into one
// leaves a single entry whose vote is the group's total (electoral votes) and whose key and value
// are chosen by the rule:
//   Zip      ZIP-merging: the value is the mean of the group's values weighted by their attention
//            (p_i exp(q.k_i * scale) for the query q), the key the same mean of the keys moved
//            along q so that p exp(q.k * scale) of the merged entry equals the group's sum. For
//            that query the attention output over the window is unchanged by the merge.
//   Votes    votes without ZIP: key and value the vote-weighted means (the plain average of
//            the original tokens the entries stand for); KeepKV's ablation keepkv_ev.
//   Average  no votes: key and value the plain mean of the entries, the vote the first
//            entry's (merging as averaging methods do).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace wm::llm {

enum class MergeRule { Zip, Votes, Average };
const char* merge_rule_name(MergeRule r);

struct MergedKv {
  at::Tensor k, v;  // [n_kv_heads, groups, head_dim]
  at::Tensor logw;  // [groups]
};

// Merges entries of one layer by group. k, v [n_kv_heads, n, head_dim] and logw [n] are the
// entries (keys rotated, as the window holds them); group[i] in [0, groups) is the merged entry
// entry i goes into (every group non-empty); q [n_kv_heads, head_dim] is the query Zip is exact
// for (one per kv head: with grouped query heads, their mean), scale the attention's (1/sqrt(d)).
// A group of one entry comes out as it went in, bit for bit. Computed in float64, returned in
// k's dtype (logw float32). Throws wm::Error on mismatched shapes or a bad group index.
MergedKv merge_groups(const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw,
                      const std::vector<int64_t>& group, int64_t groups, const at::Tensor& q, double scale,
                      MergeRule rule);

}  // namespace wm::llm
