// The video memory policies by name. Adding one: a file in this folder defining the class and
// its factory (make_<name>), the factory's declaration below, and its line in the table.
#include <utility>

#include "runtime/error.h"
#include "runtime/named_registry.h"
#include "worldkv/video_policy.h"

namespace wm::worldkv {

std::unique_ptr<VideoPolicy> make_full_kv(const MemoryConfig& cfg);
std::unique_ptr<VideoPolicy> make_sliding_window(const MemoryConfig& cfg);
std::unique_ptr<VideoPolicy> make_sink_recent(const MemoryConfig& cfg);
std::unique_ptr<VideoPolicy> make_worldkv(const MemoryConfig& cfg);
std::unique_ptr<VideoPolicy> make_worldkv_c(const MemoryConfig& cfg);
std::unique_ptr<VideoPolicy> make_worldkv_attn(const MemoryConfig& cfg);

namespace {

using Factory = std::unique_ptr<VideoPolicy> (*)(const MemoryConfig&);

// In the order programs list them.
const NamedFactories<Factory>& registry() {
  static const NamedFactories<Factory> table = {
      {"full_kv", make_full_kv},
      {"sliding_window", make_sliding_window},
      {"sink_recent", make_sink_recent},
      {"worldkv", make_worldkv},
      {"worldkv_c", make_worldkv_c},
      {"worldkv_attn", make_worldkv_attn},
  };
  return table;
}

}  // namespace

std::vector<std::string> policy_names() { return registered_names(registry()); }

std::unique_ptr<VideoPolicy> make_policy(const MemoryConfig& cfg) {
  const Policy named(cfg.policy.name());  // throws wm::Error listing the registered names if unknown
  for (auto& [name, make] : registry())
    if (name == named.name()) return make(cfg);
  throw Error(str_cat("policy '", named.name(), "' is not in the registry"));  // not reached
}

bool banks(const Policy& p) {
  // Asked of the policy itself, made for a one-token-per-frame config: making a video policy
  // allocates nothing.
  MemoryConfig probe;
  probe.tokens_per_frame = 1;
  probe.policy = p;
  return make_policy(probe)->banks();
}

}  // namespace wm::worldkv
