#pragma once
// Deterministic, platform-independent random numbers for the text task generators.
// std::*_distribution and std::shuffle differ between standard libraries, so they are not used:
// the same seed gives the same text everywhere.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wm::llmtasks {

// SplitMix64 finaliser: a well-mixed 64-bit hash of x.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Hash of two values, for deriving sub-seeds: (seed, index) -> seed.
inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b + 0x632BE59BD9B4E019ull)); }

// FNV-1a of a string (task names -> stream tags).
inline uint64_t hash_string(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(mix64(seed)) {}
  // Next raw 64-bit value.
  uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform integer in [lo, hi] (inclusive); returns lo when hi <= lo.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(next() % span);
  }
  // Uniform index in [0, n); n >= 1.
  size_t index(size_t n) { return n <= 1 ? 0 : static_cast<size_t>(next() % n); }
  // Uniform double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // True with probability p.
  bool chance(double p) { return uniform() < p; }
  // A fresh sub-seed drawn from this stream.
  uint64_t fork() { return next(); }
  // A uniformly chosen element of a non-empty vector.
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[index(v.size())]; }
  // Fisher-Yates shuffle in place.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[index(i)]);
  }

 private:
  uint64_t state_;
};

}  // namespace wm::llmtasks
