#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "runtime/layer_loader.h"
#include "runtime/safetensors.h"
#include "test_util.h"

namespace wm {
namespace {

namespace fs = std::filesystem;

TEST(Safetensors, RoundTripByName) {
  const std::string path = (fs::temp_directory_path() / "wm_test_rt.safetensors").string();
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
  fs::remove(path);
}

TEST(Safetensors, DamagedFilesAreReported) {
  const std::string path = (fs::temp_directory_path() / "wm_test_bad.safetensors").string();
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
  fs::remove(path);
}

TEST(LayerLoader, DeliversEveryLayerBitExactFromAllTiers) {
  const std::string dir = (fs::temp_directory_path() / "wm_test_loader").string();
  fs::create_directories(dir);
  StoreConfig cfg;
  cfg.spill_dir = dir;
  BlockStore store(cfg);
  std::vector<Block> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(test::random_block("b" + std::to_string(i), 5, 2, 7, 8, at::kFloat, 1, true));
    store.put(blocks.back(), static_cast<Tier>(i));
  }
  LayerLoader loader(store, {"b2", "b0", "b1"}, 5, at::kCPU, 2);
  for (int l = 0; l < 5; ++l) {
    auto layer = loader.wait(l);
    ASSERT_EQ(layer.size(), 3u);
    const int order[3] = {2, 0, 1};
    for (int j = 0; j < 3; ++j) {
      EXPECT_TRUE(test::bit_equal(layer[j].k, blocks[order[j]].layers[l].k));
      EXPECT_TRUE(test::bit_equal(layer[j].v, blocks[order[j]].layers[l].v));
      EXPECT_TRUE(test::bit_equal(layer[j].pos, blocks[order[j]].layers[l].pos));
    }
  }
  EXPECT_THROW(loader.wait(2), Error);  // layers go forward only
  fs::remove_all(dir);
}

TEST(LayerLoader, MissingBlockFailsAtWait) {
  StoreConfig cfg;
  BlockStore store(cfg);
  LayerLoader loader(store, {"absent"}, 2, at::kCPU);
  EXPECT_THROW(loader.wait(0), Error);
}

}  // namespace
}  // namespace wm
