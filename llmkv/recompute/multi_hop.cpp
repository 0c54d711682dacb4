#include "llmkv/recompute/multi_hop.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "runtime/error.h"

namespace wm::llm {

std::vector<int> top_within_budget(const std::vector<double>& scores, const std::vector<int64_t>& tokens,
                                   const std::vector<char>& candidate, int64_t budget) {
  WM_CHECK(scores.size() == tokens.size() && tokens.size() == candidate.size(), "scores (", scores.size(),
           "), tokens (", tokens.size(), ") and candidate (", candidate.size(), ") must be per unit");
  std::vector<int> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] > scores[b]; });
  std::vector<int> out;
  int64_t used = 0;
  for (int u : order) {
    if (!candidate[u] || tokens[u] <= 0 || used + tokens[u] > budget) continue;
    out.push_back(u);
    used += tokens[u];
  }
  std::sort(out.begin(), out.end());
  return out;
}

MultiHopSelection multi_hop_select(const std::vector<double>& direct, const std::vector<int64_t>& tokens,
                                   const std::vector<char>& candidate, int64_t budget, const UnitRows& rows,
                                   int max_hops) {
  const size_t n = direct.size();
  MultiHopSelection res;
  res.scores = direct;
  res.selected = top_within_budget(direct, tokens, candidate, budget);
  std::map<int, std::vector<double>> known;  // rows asked so far
  std::vector<double> prev = direct;
  while (res.hops < max_hops && !res.selected.empty()) {
    std::vector<int> missing;
    for (int s : res.selected)
      if (!known.count(s)) missing.push_back(s);
    if (!missing.empty()) {
      std::vector<std::vector<double>> got = rows(missing);
      WM_CHECK(got.size() == missing.size(), "asked for ", missing.size(), " rows, got ", got.size());
      for (size_t i = 0; i < missing.size(); ++i) {
        WM_CHECK(got[i].size() == n, "a row must have one entry per unit (", n, "), got ", got[i].size());
        known[missing[i]] = std::move(got[i]);
      }
    }
    std::vector<double> score = direct;
    for (int s : res.selected) {
      const std::vector<double>& row = known.at(s);
      for (size_t t = 0; t < n; ++t)
        if (static_cast<int>(t) != s) score[t] += prev[s] * row[t];
    }
    ++res.hops;
    std::vector<int> next = top_within_budget(score, tokens, candidate, budget);
    res.scores = score;
    prev = std::move(score);
    if (next == res.selected) break;
    res.selected = std::move(next);
  }
  return res;
}

}  // namespace wm::llm
