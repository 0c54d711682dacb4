#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/hash.h"

namespace wm {
namespace {

TEST(Xxh64, KnownVectors) {
  EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64("abc", 3), 0x44BC2CF5AD770999ULL);
  // An empty range may come with a null pointer (an empty tensor's data): same digest, and no
  // memcpy from null (UBSan reports that in the sanitizer build).
  EXPECT_EQ(xxh64(nullptr, 0), 0xEF46DB3751D8E999ULL);
  Xxh64 s;
  s.update("abc", 3);
  s.update(nullptr, 0);
  EXPECT_EQ(s.digest(), 0x44BC2CF5AD770999ULL);
}

TEST(Xxh64, StreamingEqualsOneShot) {
  std::mt19937 rng(3);
  std::vector<unsigned char> data(1000);
  for (auto& c : data) c = static_cast<unsigned char>(rng());
  for (size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 100u, 1000u}) {
    const uint64_t one = xxh64(data.data(), n, 42);
    Xxh64 s(42);
    size_t i = 0;
    while (i < n) {
      size_t step = std::min<size_t>(n - i, 1 + rng() % 40);
      s.update(data.data() + i, step);
      i += step;
    }
    EXPECT_EQ(s.digest(), one) << n;
  }
  std::vector<unsigned char> flipped = data;
  flipped[500] ^= 1;
  EXPECT_NE(xxh64(data.data(), 1000), xxh64(flipped.data(), 1000));
}

}  // namespace
}  // namespace wm
