#include "worldkv/policy.h"

#include <algorithm>

#include "runtime/error.h"

namespace wm::worldkv {

Policy::Policy(std::string name) : name_(std::move(name)) {
  const std::vector<std::string> names = policy_names();
  if (std::find(names.begin(), names.end(), name_) != names.end()) return;
  std::string all;
  for (auto& n : names) all += (all.empty() ? "" : ", ") + n;
  throw Error(str_cat("unknown policy '", name_, "' (policies: ", all, ")"));
}

const Policy Policy::FullKv{"full_kv", Unchecked{}};
const Policy Policy::SlidingWindow{"sliding_window", Unchecked{}};
const Policy Policy::SinkRecent{"sink_recent", Unchecked{}};
const Policy Policy::WorldKv{"worldkv", Unchecked{}};
const Policy Policy::WorldKvC{"worldkv_c", Unchecked{}};
const Policy Policy::WorldKvAttn{"worldkv_attn", Unchecked{}};

Policy parse_policy(const std::string& name) { return Policy(name); }

std::string policy_name(const Policy& p) { return p.name(); }

Placement parse_placement(const std::string& name) {
  if (name == "original") return Placement::Original;
  if (name == "reanchored") return Placement::Reanchored;
  throw Error(str_cat("unknown placement '", name, "' (original, reanchored)"));
}

std::string placement_name(Placement p) { return p == Placement::Original ? "original" : "reanchored"; }

}  // namespace wm::worldkv
