#include "runtime/hash.h"

#include <cstdio>
#include <cstring>

// Debian's libxxhash (libxxhash-dev), compiled into this unit (XXH_INLINE_ALL): nothing to link,
// and the digests are the reference implementation's.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace wm {

namespace {
XXH64_state_t* state_of(unsigned char* storage) { return reinterpret_cast<XXH64_state_t*>(storage); }
const XXH64_state_t* state_of(const unsigned char* storage) {
  return reinterpret_cast<const XXH64_state_t*>(storage);
}
}  // namespace

static_assert(sizeof(XXH64_state_t) <= sizeof(Xxh64::Storage), "Xxh64's storage is too small for XXH64_state_t");
static_assert(alignof(XXH64_state_t) <= alignof(Xxh64::Storage), "Xxh64's storage is misaligned for XXH64_state_t");

Xxh64::Xxh64(uint64_t seed) { XXH64_reset(state_of(state_.bytes), seed); }

void Xxh64::update(const void* data, size_t n) {
  if (n == 0) return;  // an empty range may come with a null pointer
  XXH64_update(state_of(state_.bytes), data, n);
}

uint64_t Xxh64::digest() const { return XXH64_digest(state_of(state_.bytes)); }

uint64_t xxh64(const void* data, size_t n, uint64_t seed) {
  return n == 0 ? XXH64(nullptr, 0, seed) : XXH64(data, n, seed);
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace wm
