// full: no eviction; the window holds the whole context (the reference the others are measured
// against).
#include "llmkv/text_policy.h"

namespace wm::llm {
namespace {

class Full final : public TextPolicy {
 public:
  bool stateless() const override { return true; }
  using TextPolicy::TextPolicy;
};

}  // namespace

std::unique_ptr<TextPolicy> make_full(const TextMemoryConfig& cfg) { return std::make_unique<Full>(cfg); }

}  // namespace wm::llm
