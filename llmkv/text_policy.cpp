#include "llmkv/text_policy.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace wm::llm {

nlohmann::json TextPolicy::save_state() const {
  WM_CHECK(stateless(), "policy '", name(),
           "' keeps per-token state that a session snapshot does not hold yet (snapshots take evoke, "
           "evoke_discard, evoke_breadcrumb and the stateless full, recency, streaming_llm, snapkv, pyramidkv)");
  return nlohmann::json::object();
}

void TextPolicy::load_state(const nlohmann::json& state, const KvMemory&) {
  WM_CHECK(stateless(), "policy '", name(), "' cannot take a session snapshot's state");
  if (!state.is_object() || !state.empty())
    throw CorruptData(str_cat("policy '", name(), "' keeps no state, the snapshot holds ", state.dump().substr(0, 80)));
}

void TextMemoryConfig::validate() const {
  WM_CHECK(budget >= 0, "the KV budget must be >= 0 tokens, got ", budget);
  WM_CHECK(policy == "full" || budget > 0, "policy '", policy, "' needs a KV budget (--kv-budget) in tokens");
  WM_CHECK(slack >= 0 && (budget == 0 || slack < budget), "slack must be in [0, budget), got ", slack);
  WM_CHECK(sink >= 0, "sink must be >= 0, got ", sink);
  WM_CHECK(recent >= 0, "recent must be >= 0, got ", recent);
  WM_CHECK(window > 0, "the observation window must be > 0, got ", window);
  WM_CHECK(kernel > 0 && kernel % 2 == 1, "the pooling kernel must be odd and > 0, got ", kernel);
  WM_CHECK(adakv_floor >= 0 && adakv_floor <= 1, "adakv_floor must be in [0, 1], got ", adakv_floor);
  WM_CHECK(score_decay > 0.0 && score_decay < 1.0, "score_decay must be in (0, 1), got ", score_decay);
  WM_CHECK(score_kernel > 0 && score_kernel % 2 == 1, "score_kernel must be odd and > 0, got ", score_kernel);
  WM_CHECK(score_window >= 0, "score_window must be >= 0, got ", score_window);
  WM_CHECK(refresh_every >= 0, "refresh_every must be >= 0, got ", refresh_every);
  WM_CHECK(recovery == "restore" || recovery == "discard" || recovery == "breadcrumb",
           "recovery must be restore, discard or breadcrumb, got '", recovery, "'");
  WM_CHECK(placement == "tail" || placement == "original" || placement == "compact",
           "placement must be original, tail or compact, got '", placement, "'");
  WM_CHECK(relevance == "attention" || relevance == "hidden" || relevance == "embedding",
           "relevance must be attention, hidden or embedding, got '", relevance, "'");
  WM_CHECK(recall_blocks >= 0, "recall_blocks must be >= 0, got ", recall_blocks);
  WM_CHECK(message_blocks >= 0, "message_blocks must be >= 0, got ", message_blocks);
  WM_CHECK(std::isfinite(relevance_margin), "relevance_margin must be finite, got ", relevance_margin);
  WM_CHECK(reserve >= 0, "reserve must be >= 0, got ", reserve);
  WM_CHECK(sink_blocks >= 0, "sink_blocks must be >= 0, got ", sink_blocks);
  for (const auto& [kind, n] : kind_floors)
    WM_CHECK(n >= 0, "the floor of block kind '", kind, "' must be >= 0, got ", n);
  WM_CHECK(pyramid_beta >= 1.0, "pyramid_beta must be >= 1, got ", pyramid_beta);
}

std::vector<int64_t> keep_top_and_recent(const at::Tensor& scores, int64_t k, int64_t n, int64_t recent) {
  recent = std::min(recent, n);
  const int64_t m = std::min<int64_t>(scores.size(0), n - recent);  // candidates: before the recent ones
  k = std::max<int64_t>(0, std::min(k, m));
  std::vector<int64_t> keep;
  keep.reserve(k + recent);
  if (k > 0) {
    // A stable order: higher score first, the earlier token on a tie.
    at::Tensor s = scores.narrow(0, 0, m).to(at::kCPU, at::kDouble).contiguous();
    const double* p = s.data_ptr<double>();
    std::vector<int64_t> idx(m);
    for (int64_t i = 0; i < m; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    keep.assign(idx.begin(), idx.begin() + k);
    std::sort(keep.begin(), keep.end());
  }
  for (int64_t i = n - recent; i < n; ++i) keep.push_back(i);
  return keep;
}

std::vector<int64_t> pyramid_budgets(int64_t budget, int n_layers, double beta, int64_t floor) {
  WM_CHECK(n_layers > 0 && budget > 0 && beta >= 1.0, "pyramid budgets need layers, a budget and beta >= 1");
  const int64_t top = std::max<int64_t>(floor, static_cast<int64_t>(budget / beta));
  if (top >= budget || n_layers == 1) return std::vector<int64_t>(n_layers, budget);
  const int64_t bottom = 2 * budget - top;
  std::vector<int64_t> b(n_layers);
  int64_t sum = 0;
  for (int l = 0; l < n_layers; ++l) {
    // Rounded down, so the sum falls short of the total by fewer than n_layers tokens.
    b[l] = top + (bottom - top) * (n_layers - 1 - l) / (n_layers - 1);
    sum += b[l];
  }
  for (int l = 0; sum < budget * n_layers; ++l) ++b[l], ++sum;  // the lower layers take the rest
  return b;
}

}  // namespace wm::llm
