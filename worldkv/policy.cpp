#include "worldkv/policy.h"

#include "runtime/error.h"

namespace wm::worldkv {

namespace {
const std::vector<std::pair<std::string, Policy>>& table() {
  static const std::vector<std::pair<std::string, Policy>> t = {
      {"full_kv", Policy::FullKv},   {"sliding_window", Policy::SlidingWindow}, {"sink_recent", Policy::SinkRecent},
      {"worldkv", Policy::WorldKv}, {"worldkv_c", Policy::WorldKvC},           {"worldkv_attn", Policy::WorldKvAttn}};
  return t;
}
}  // namespace

Policy parse_policy(const std::string& name) {
  for (auto& [n, p] : table())
    if (n == name) return p;
  std::string all;
  for (auto& [n, p] : table()) all += (all.empty() ? "" : ", ") + n;
  throw Error(str_cat("unknown policy '", name, "' (policies: ", all, ")"));
}

std::string policy_name(Policy p) {
  for (auto& [n, q] : table())
    if (q == p) return n;
  return "?";
}

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (auto& [n, p] : table()) out.push_back(n);
  return out;
}

Placement parse_placement(const std::string& name) {
  if (name == "original") return Placement::Original;
  if (name == "reanchored") return Placement::Reanchored;
  throw Error(str_cat("unknown placement '", name, "' (original, reanchored)"));
}

std::string placement_name(Placement p) { return p == Placement::Original ? "original" : "reanchored"; }

}  // namespace wm::worldkv
