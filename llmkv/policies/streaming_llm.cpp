// streaming_llm: StreamingLLM's attention sinks (the first `sink` tokens) and the most recent
// tokens, `budget` in all. After an eviction the recent tokens are re-anchored to follow the
// sinks (keys rotated by one RoPE rotation), so positions stay within the cache's length and
// the next token takes the position after the last one kept.
#include "llmkv/text_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class StreamingLlm final : public TextPolicy {
 public:
  bool stateless() const override { return true; }
  explicit StreamingLlm(const TextMemoryConfig& cfg) : TextPolicy(cfg) {
    WM_CHECK(cfg.budget - cfg.slack > cfg.sink, "streaming_llm needs a KV budget (less slack) above its ", cfg.sink,
             " sink tokens, got ", cfg.budget - cfg.slack);
  }

  MemoryPlan observe(const KvMemory& memory, const StepView&) override {
    MemoryPlan plan;
    const KvWindow& w = memory.window();
    const int64_t S = cfg_.sink, R = evict_to() - cfg_.sink;
    for (int l = 0; l < w.spec().n_layers; ++l) {
      const int64_t n = w.size(l);
      if (n <= cfg_.budget) continue;
      std::vector<int64_t> keep;
      keep.reserve(S + R);
      for (int64_t i = 0; i < S; ++i) keep.push_back(i);
      for (int64_t i = n - R; i < n; ++i) keep.push_back(i);
      const at::Tensor pos = w.pos(l);  // [n, 1] CPU
      const int64_t want = S > 0 ? pos[S - 1][0].item<int64_t>() + 1 : 0;
      const int64_t delta = want - pos[n - R][0].item<int64_t>();
      plan.keep(l, std::move(keep));
      if (delta != 0) plan.shift(l, S, R, Reanchor{0, delta});
    }
    return plan;
  }

  int64_t next_position(const KvWindow& w, int64_t next) const override {
    const int64_t n = w.size(0);
    return n > 0 ? w.pos(0)[n - 1][0].item<int64_t>() + 1 : next;
  }
};

}  // namespace

std::unique_ptr<TextPolicy> make_streaming_llm(const TextMemoryConfig& cfg) {
  return std::make_unique<StreamingLlm>(cfg);
}

}  // namespace wm::llm
