#pragma once
// Video memory policies by name, and where retrieved chunks go. Each policy is a class in
// worldkv/policies/ registered by name there (registry.cpp); the built-in ones lay out the
// window as (sizes in frames, MemoryConfig):
//   full_kv         [sink | recent]            never evicts; the window grows with the rollout
//   sliding_window  [recent]                   FIFO over the same total size as worldkv
//   sink_recent     [sink | recent]            first chunk kept, FIFO over the rest
//   worldkv         [sink | retrieved | recent] evicted chunks banked, retrieved by pose
//   worldkv_c       as worldkv, chunks compressed (key-key) as they enter the bank
//   worldkv_attn    as worldkv, retrieved by query-key importance instead of pose
#include <string>
#include <vector>

namespace wm::worldkv {

// A video memory policy by its registered name: a value to copy, compare and print.
class Policy {
 public:
  // The policy registered as `name`; throws wm::Error listing the registered names otherwise.
  explicit Policy(std::string name);
  const std::string& name() const { return name_; }
  bool operator==(const Policy& o) const { return name_ == o.name_; }
  bool operator!=(const Policy& o) const { return name_ != o.name_; }

  // The built-in policies, for code that picks one directly (a viewer key, a test). A policy
  // added later needs no constant here: Policy("its_name") or parse_policy() names it.
  static const Policy FullKv, SlidingWindow, SinkRecent, WorldKv, WorldKvC, WorldKvAttn;

 private:
  struct Unchecked {};
  Policy(std::string name, Unchecked) : name_(std::move(name)) {}
  std::string name_;
};

enum class Placement { Original, Reanchored };

// "full_kv", "sliding_window", ... ; throws wm::Error listing the valid names otherwise.
Policy parse_policy(const std::string& name);
std::string policy_name(const Policy& p);
// The registered names, in the registry's order.
std::vector<std::string> policy_names();
Placement parse_placement(const std::string& name);  // "original" or "reanchored"
std::string placement_name(Placement p);

// Whether the policy's evicted chunks go to the bank (and can come back).
bool banks(const Policy& p);

}  // namespace wm::worldkv
