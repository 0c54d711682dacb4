#pragma once
// XXH64 (Yann Collet's xxHash, 64-bit variant): a fast non-cryptographic checksum for spill
// files, session files and the remote store's values. Debian's libxxhash computes it
// (runtime/hash.cpp); digests equal those of the project's earlier hand-written implementation
// (tests/runtime/fixtures/xxh64).
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

  // libxxhash's XXH64_state_t, held by value (copyable; no allocation).
  struct alignas(8) Storage {
    unsigned char bytes[96];
  };

 private:
  Storage state_;
};

// One-shot XXH64 of n bytes.
uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// A 64-bit hash as 16 lowercase hex digits (keys, namespaces, file names).
std::string hex64(uint64_t v);

}  // namespace wm
