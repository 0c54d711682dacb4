// pyramidkv: PyramidKV. SnapKV's selection with budgets that shrink from the lower layers to the
// upper ones (pyramid_budgets: the same total as snapkv at the same budget), per kv head;
// pyramidkv_layer: the votes pooled over the kv heads.
#include <algorithm>

#include "llmkv/policies/snapkv.h"

namespace wm::llm {
namespace {

class PyramidKv final : public SnapKv {
 public:
  using SnapKv::SnapKv;

 protected:
  std::vector<int64_t> budgets(int n_layers) const override {
    return pyramid_budgets(cfg_.budget, n_layers, cfg_.pyramid_beta, std::min(cfg_.budget, cfg_.window + 1));
  }
};

}  // namespace

std::unique_ptr<TextPolicy> make_pyramidkv(const TextMemoryConfig& cfg) {
  return std::make_unique<PyramidKv>(cfg, true);
}
std::unique_ptr<TextPolicy> make_pyramidkv_layer(const TextMemoryConfig& cfg) {
  return std::make_unique<PyramidKv>(cfg, false);
}

}  // namespace wm::llm
