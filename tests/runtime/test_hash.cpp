#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "runtime/hash.h"
#include "runtime/spill_file.h"
#include "tests/runtime/test_util.h"

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

// Bytes 0..n-1 of a fixed pattern: the committed digests' input.
std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + 7) & 0xff);
  return s;
}
const std::string kFixtures = std::string(WM_SOURCE_DIR) + "/tests/runtime/fixtures/xxh64";
const std::vector<size_t> kLengths = {0, 1, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 100, 1000, 4096, 65537};
const std::vector<uint64_t> kSeeds = {0, 42, 0x6d6f64656cull};

// Digests and a spill file written by the hand-written XXH64 the project had before it used
// Debian's libxxhash: what was written then still reads (spill files, session files and Redis
// values carry these checksums).
TEST(Xxh64, DigestsAndFilesWrittenBeforeStillMatch) {
  std::ifstream f(kFixtures + "/digests.json");
  ASSERT_TRUE(f) << "missing " << kFixtures << "/digests.json";
  const nlohmann::json j = nlohmann::json::parse(f);
  size_t k = 0;
  for (uint64_t seed : kSeeds)
    for (size_t n : kLengths) {
      const std::string s = pattern(n);
      EXPECT_EQ(hex64(xxh64(s.data(), n, seed)), j.at(k++).get<std::string>()) << "n " << n << " seed " << seed;
    }
  const Block b = read_spill_file(kFixtures + "/block.spill");
  EXPECT_EQ(b.id, "before-libxxhash");
  EXPECT_EQ(b.n_layers(), 2);
}

// Writes the fixtures above (run once, by hand, with the implementation whose output they keep).
TEST(Xxh64, DISABLED_WriteFixtures) {
  std::filesystem::create_directories(kFixtures);
  nlohmann::json j = nlohmann::json::array();
  for (uint64_t seed : kSeeds)
    for (size_t n : kLengths) {
      const std::string s = pattern(n);
      j.push_back(hex64(xxh64(s.data(), n, seed)));
    }
  std::ofstream(kFixtures + "/digests.json") << j.dump(1) << "\n";
  write_spill_file(kFixtures + "/block.spill", test::random_block("before-libxxhash", 2, 1, 3, 4, at::kFloat));
}

}  // namespace
}  // namespace wm
