#pragma once
// XXH64 (Yann Collet's xxHash, 64-bit variant): a fast non-cryptographic checksum for spill
// files. Implemented from the published specification.
#include <cstddef>
#include <cstdint>
#include <string>

namespace wm {

// Streaming XXH64. update() any number of times, then digest(); digest() does not reset.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

// One-shot XXH64 of n bytes.
uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// A 64-bit hash as 16 lowercase hex digits (keys, namespaces, file names).
std::string hex64(uint64_t v);

}  // namespace wm
