#pragma once
// Deterministic, platform-independent random numbers for the text task generators.
// std::*_distribution and std::shuffle differ between standard libraries, so they are not used:
// the same seed gives the same text everywhere.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tools/world/rng.h"

namespace wm::llmtasks {

using world::hash_combine;
using world::mix64;

// FNV-1a of a string (task names -> stream tags).
inline uint64_t hash_string(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// The world generator's stream (same seeds, same numbers), with the helpers text needs.
class Rng : public world::Rng {
 public:
  using world::Rng::Rng;
  // Uniform integer in [lo, hi] (inclusive); returns lo when hi <= lo.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(next() % span);
  }
  // Uniform index in [0, n); n >= 1.
  size_t index(size_t n) { return n <= 1 ? 0 : static_cast<size_t>(next() % n); }
  // A uniformly chosen element of a non-empty vector.
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[index(v.size())]; }
  // Fisher-Yates shuffle in place.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[index(i)]);
  }
};

}  // namespace wm::llmtasks
