#pragma once
// Memory policies of the video path and how they lay out the window (sizes in frames).
//   full_kv         [sink | recent]            never evicts; the window grows with the rollout
//   sliding_window  [recent]                   FIFO over the same total size as worldkv
//   sink_recent     [sink | recent]            first chunk kept, FIFO over the rest
//   worldkv         [sink | retrieved | recent] evicted chunks banked, retrieved by pose
//   worldkv_c       as worldkv, chunks compressed (key-key) as they enter the bank
//   worldkv_attn    as worldkv, retrieved by query-key importance instead of pose
#include <string>
#include <vector>

namespace wm::worldkv {

enum class Policy { FullKv, SlidingWindow, SinkRecent, WorldKv, WorldKvC, WorldKvAttn };
enum class Placement { Original, Reanchored };

// "full_kv", "sliding_window", ... ; throws wm::Error listing the valid names otherwise.
Policy parse_policy(const std::string& name);
std::string policy_name(Policy p);
std::vector<std::string> policy_names();
Placement parse_placement(const std::string& name);  // "original" or "reanchored"
std::string placement_name(Placement p);

// Whether evicted chunks go to the bank (and can come back).
inline bool banks(Policy p) { return p == Policy::WorldKv || p == Policy::WorldKvC || p == Policy::WorldKvAttn; }

}  // namespace wm::worldkv
