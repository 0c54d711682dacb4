#pragma once
// Deterministic, platform-independent random numbers for world and trajectory generation.
// (std::uniform_*_distribution differ between standard libraries, so they are not used.)
#include <cstdint>

namespace wm::world {

// SplitMix64 step: a well-mixed 64-bit hash of x.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Hash of two values, for deriving sub-seeds (seed, index) -> seed.
inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b + 0x632BE59BD9B4E019ull)); }

// Seeds kept below 2^48 so that they survive JSON readers that hold numbers as doubles.
inline uint64_t json_safe_seed(uint64_t x) { return x & 0xFFFFFFFFFFFFull; }

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(mix64(seed)) {}
  // Next raw 64-bit value.
  uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform integer in [lo, hi] (inclusive); lo <= hi.
  int uniform_int(int lo, int hi) {
    if (hi <= lo) return lo;
    uint64_t span = static_cast<uint64_t>(static_cast<int64_t>(hi) - lo) + 1;
    return lo + static_cast<int>(next() % span);
  }
  // Uniform double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform double in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // True with probability p.
  bool chance(double p) { return uniform() < p; }
  // A fresh sub-seed drawn from this stream.
  uint64_t fork() { return next(); }

 private:
  uint64_t state_;
};

}  // namespace wm::world
