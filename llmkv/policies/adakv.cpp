// adakv: AdaKV (Feng et al., 2024) on SnapKV's selection. The layer's budget is shared by its kv
// heads, not split evenly: of the n_kv_heads x k candidate tokens the layer may keep (k = its
// per-head share after the observation window), each head first takes its own top
// floor(adakv_floor x k), and the rest go to the highest votes over all heads, so a head whose
// attention is concentrated keeps few tokens and one whose attention is spread keeps many. The
// votes are attention mass summed over the same queries for every head, so they compare across
// heads.
#include <ATen/ops/sort.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "llmkv/policies/snapkv.h"

namespace wm::llm {
namespace {

class AdaKv final : public SnapKv {
 public:
  AdaKv(const TextMemoryConfig& cfg) : SnapKv(cfg, true) {}

 protected:
  std::vector<int64_t> head_shares(const at::Tensor& votes, int64_t k) const override {
    const int64_t KH = votes.size(0), m = votes.size(1);
    const int64_t floor = static_cast<int64_t>(std::floor(cfg_.adakv_floor * static_cast<double>(k)));
    std::vector<int64_t> share(KH, 0);
    if (m == 0 || k <= 0) return share;
    // Each head's votes in descending order; its first `floor` are its own, the rest compete.
    auto [sorted, order] = at::sort(votes.to(at::kCPU, at::kFloat), /*dim=*/1, /*descending=*/true);
    (void)order;
    const at::Tensor s = sorted.contiguous();
    const float* p = s.data_ptr<float>();
    const float ninf = -std::numeric_limits<float>::infinity();
    struct Cand {
      float v;
      int64_t h, r;
    };
    std::vector<Cand> rest;
    for (int64_t h = 0; h < KH; ++h) {
      int64_t r = 0;
      for (; r < std::min(floor, m) && p[h * m + r] > ninf; ++r) ++share[h];
      for (; r < m && p[h * m + r] > ninf; ++r) rest.push_back({p[h * m + r], h, r});
    }
    const int64_t left = std::min<int64_t>(KH * k - std::accumulate(share.begin(), share.end(), int64_t{0}),
                                           static_cast<int64_t>(rest.size()));
    // Highest votes first; ties to the lower head, then its higher-ranked token.
    std::partial_sort(rest.begin(), rest.begin() + std::max<int64_t>(left, 0), rest.end(),
                      [](const Cand& a, const Cand& b) {
                        return a.v > b.v || (a.v == b.v && (a.h < b.h || (a.h == b.h && a.r < b.r)));
                      });
    for (int64_t i = 0; i < left; ++i) ++share[rest[i].h];
    return share;
  }
};

}  // namespace

std::unique_ptr<TextPolicy> make_adakv(const TextMemoryConfig& cfg) { return std::make_unique<AdaKv>(cfg); }

}  // namespace wm::llm
