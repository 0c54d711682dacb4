// The text memory policies by name. Adding one: a file in this folder defining the class and its
// factory (make_<name>), the factory's declaration below, and its line in the table.
#include <utility>

#include "llmkv/text_policy.h"
#include "runtime/error.h"
#include "runtime/named_registry.h"

namespace wm::llm {

std::unique_ptr<TextPolicy> make_full(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_recency(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_streaming_llm(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_h2o(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_snapkv(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_pyramidkv(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_snapkv_layer(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_pyramidkv_layer(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_adakv(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_keepkv(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_keepkv_ev(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_keepkv_layer(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_keepkv_ev_layer(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_evoke(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_evoke_discard(const TextMemoryConfig& cfg);
std::unique_ptr<TextPolicy> make_evoke_breadcrumb(const TextMemoryConfig& cfg);

namespace {

using Factory = std::unique_ptr<TextPolicy> (*)(const TextMemoryConfig&);

// In the order programs list them.
const NamedFactories<Factory>& registry() {
  static const NamedFactories<Factory> table = {
      {"full", make_full},           {"recency", make_recency}, {"streaming_llm", make_streaming_llm},
      {"h2o", make_h2o},             {"snapkv", make_snapkv},   {"pyramidkv", make_pyramidkv},
      {"snapkv_layer", make_snapkv_layer}, {"pyramidkv_layer", make_pyramidkv_layer}, {"adakv", make_adakv},
      {"keepkv", make_keepkv},       {"keepkv_ev", make_keepkv_ev},
      {"keepkv_layer", make_keepkv_layer}, {"keepkv_ev_layer", make_keepkv_ev_layer}, {"evoke", make_evoke},
      {"evoke_discard", make_evoke_discard}, {"evoke_breadcrumb", make_evoke_breadcrumb},
  };
  return table;
}

}  // namespace

std::vector<std::string> text_policy_names() { return registered_names(registry()); }

std::unique_ptr<TextPolicy> make_text_policy(const TextMemoryConfig& cfg) {
  const Factory make = find_registered(registry(), cfg.policy, "memory policy");
  cfg.validate();
  return make(cfg);
}

}  // namespace wm::llm
