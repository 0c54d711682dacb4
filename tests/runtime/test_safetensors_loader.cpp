#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "test_util.h"
#include "tests/temp_dir.h"

namespace wm {
namespace {

namespace fs = std::filesystem;

TEST(Safetensors, RoundTripByName) {
  const fs::path dir = wm::testing::make_temp_dir("wm_test_rt_");
  const std::string path = (dir / "wm_test_rt.safetensors").string();
  std::vector<std::pair<std::string, at::Tensor>> ts = {
      {"blocks.0.attn.q.weight", at::randn({4, 3})},
      {"blocks.0.norm.weight", at::randn({7}).to(at::kHalf)},
      {"emb", at::randn({2, 2}).to(at::kBFloat16)},
      {"step", at::tensor({42}, at::kLong)}};
  save_safetensors(path, ts, {{"format", "pt"}});
  SafeTensors st = SafeTensors::open(path);
  EXPECT_EQ(st.names().size(), 4u);
  for (auto& [name, t] : ts) EXPECT_TRUE(test::bit_equal(st.get(name), t)) << name;
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_THROW(st.get("missing"), Error);
  fs::remove_all(dir);
}

TEST(Safetensors, DamagedFilesAreReported) {
  const fs::path dir = wm::testing::make_temp_dir("wm_test_bad_");
  const std::string path = (dir / "wm_test_bad.safetensors").string();
  save_safetensors(path, {{"w", at::randn({64})}});
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 8);
  EXPECT_THROW(SafeTensors::open(path), CorruptData);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const std::string h = R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})";
    uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << 'x';
  }
  try {
    SafeTensors::open(path);
    FAIL() << "an unknown dtype must be rejected";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("F8_E4M3"), std::string::npos);
  }
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    uint64_t n = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  EXPECT_THROW(SafeTensors::open(path), CorruptData);
  EXPECT_THROW(SafeTensors::open(path + ".absent"), Error);
  fs::remove_all(dir);
}

// Writes a safetensors file from a header's text and `data_bytes` zero bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << std::string(data_bytes, '\0');
}

// A header that lies must give CorruptData naming the file and the tensor: element counts
// that overflow, fields of the wrong JSON type, negative dimensions.
TEST(Safetensors, LyingHeadersNameFileAndTensor) {
  const fs::path dir = wm::testing::make_temp_dir("wm_test_lying_");
  const std::string path = (dir / "wm_test_lying.safetensors").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"overflow", R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"},
      {"overflow", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})"},
      {"dtype", R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})"},
      {"data_offsets", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})"},
      {"data_offsets", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})"},
      {"shape", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})"},
      {"shape", R"({"w":{"dtype":"F32","shape":"[1]","data_offsets":[0,4]}})"},
      {"shape", R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})"},
  };
  for (const auto& [word, header] : cases) {
    write_raw(path, header, 4);
    try {
      SafeTensors::open(path);
      ADD_FAILURE() << "accepted " << header;
    } catch (const CorruptData& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("tensor 'w'"), std::string::npos) << m;
      EXPECT_NE(m.find(word), std::string::npos) << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << header << " gave a non-CorruptData error: " << e.what();
    }
  }
  // A zero dimension makes an empty tensor whatever the others say.
  write_raw(path, R"({"w":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(SafeTensors::open(path).get("w").numel(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wm
