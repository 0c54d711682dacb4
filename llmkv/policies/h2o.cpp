// h2o: Heavy-Hitter Oracle. Every key's attention mass is accumulated over all steps so far
// (each query's softmax, summed over the kv heads and their query heads); a layer over budget
// keeps its `recent` last tokens and, of the others, the heaviest hitters.
#include "llmkv/text_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class H2o final : public TextPolicy {
 public:
  explicit H2o(const TextMemoryConfig& cfg) : TextPolicy(cfg) {
    recent_ = cfg.recent > 0 ? cfg.recent : cfg.budget / 2;
    WM_CHECK(recent_ < cfg.budget - cfg.slack, "h2o needs a KV budget (less slack) above its ", recent_,
             " recent tokens, got ", cfg.budget - cfg.slack);
  }

  StepNeeds step_needs() const override { return {true, 0, false}; }

  MemoryPlan observe(const KvMemory& memory, const StepView& step) override {
    const std::vector<at::Tensor>& mass = step.key_mass;
    const int64_t fresh = step.fresh;
    const KvWindow& w = memory.window();
    const int L = w.spec().n_layers;
    WM_CHECK(static_cast<int>(mass.size()) == L, "h2o needs the key mass of all ", L, " layers, got ", mass.size());
    acc_.resize(L);
    MemoryPlan plan;
    for (int l = 0; l < L; ++l) {
      const int64_t n = w.size(l);
      WM_CHECK(mass[l].dim() == 2 && mass[l].size(1) == n, "layer ", l, ": key mass ", mass[l].sizes(), " for ", n,
               " keys");
      const at::Tensor m = mass[l].sum(0).to(at::kDouble);
      const int64_t before = n - fresh;
      // Scores of the tokens before this step, or none if the window changed under us (reset).
      if (!acc_[l].defined() || acc_[l].size(0) != before) acc_[l] = at::zeros({before}, m.options());
      at::Tensor acc = at::cat({acc_[l], at::zeros({fresh}, m.options())}) + m;
      if (n > cfg_.budget) {
        std::vector<int64_t> keep = keep_top_and_recent(acc, evict_to() - recent_, n, recent_);
        acc = acc.index_select(0, at::tensor(keep, at::kLong).to(acc.device()));
        plan.keep(l, std::move(keep));
      }
      acc_[l] = acc;
    }
    return plan;
  }

  void reset() override { acc_.clear(); }

 private:
  int64_t recent_;
  std::vector<at::Tensor> acc_;  // per layer, per window token: attention mass so far
};

}  // namespace

std::unique_ptr<TextPolicy> make_h2o(const TextMemoryConfig& cfg) { return std::make_unique<H2o>(cfg); }

}  // namespace wm::llm
