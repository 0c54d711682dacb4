// The scheduled layer loader (LayerQueueLoader) and cold spill files (StoreConfig::drop_spill_pages).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/block_store.h"
#include "runtime/error.h"
#include "runtime/layer_loader.h"
#include "test_util.h"
#include "tests/temp_dir.h"

namespace wm {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  return wm::testing::make_temp_dir(name + "_").string();
}

// Waits (at most 5 s) until the loader's queue holds at most `n` blocks; returns what it holds.
size_t settle(const LayerQueueLoader& loader, size_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  while (loader.queued() > n && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // and gives it time to go further
  return loader.queued();
}

TEST(LayerQueueLoader, DeliversQueuedBlocksPerLayerInQueueOrderFromEveryTier) {
  const std::string dir = fresh_dir("wm_test_qloader");
  StoreConfig cfg;
  cfg.spill_dir = dir;
  BlockStore store(cfg);
  std::vector<Block> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(test::random_block("b" + std::to_string(i), 1, 2, 5 + i, 8, at::kFloat));
    store.put(blocks.back(), static_cast<Tier>(i % 3));
  }
  LayerQueueLoader loader(store, 3, at::kCPU, -1);
  loader.enqueue(0, {"b3", "b0"});
  loader.enqueue(2, {"b1"});
  loader.enqueue(0, {"b2"});
  const auto l0 = loader.wait(0);
  ASSERT_EQ(l0.ids, (std::vector<std::string>{"b3", "b0", "b2"}));
  const int order[3] = {3, 0, 2};
  for (int j = 0; j < 3; ++j) {
    ASSERT_FALSE(l0.errors[j]);
    EXPECT_TRUE(test::blocks_bit_equal(l0.blocks[j], blocks[order[j]])) << j;
  }
  EXPECT_TRUE(loader.wait(1).ids.empty());  // nothing queued for layer 1: returns at once
  loader.enqueue(2, {"b0"});
  const auto l2 = loader.wait(2);
  ASSERT_EQ(l2.ids, (std::vector<std::string>{"b1", "b0"}));
  EXPECT_TRUE(test::blocks_bit_equal(l2.blocks[0], blocks[1]));
  EXPECT_TRUE(test::blocks_bit_equal(l2.blocks[1], blocks[0]));
  EXPECT_THROW(loader.enqueue(1, {"b0"}), Error);  // layer 1 was handed out
  EXPECT_THROW(loader.wait(2), Error);             // layers go forward only
  const auto st = loader.finish();
  EXPECT_EQ(st.blocks, 5);
  EXPECT_EQ(st.bytes, blocks[3].nbytes() + 2 * blocks[0].nbytes() + blocks[2].nbytes() + blocks[1].nbytes());
  fs::remove_all(dir);
}

TEST(LayerQueueLoader, AFailedBlockComesAsItsErrorAndTheOthersStillArrive) {
  const std::string dir = fresh_dir("wm_test_qloader_bad");
  StoreConfig cfg;
  cfg.spill_dir = dir;
  BlockStore store(cfg);
  const Block good = test::random_block("good", 1, 2, 6, 8, at::kFloat);
  store.put(good, Tier::Host);
  store.put(test::random_block("bad", 1, 2, 6, 8, at::kFloat), Tier::Disk);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {  // damage the one spill file
    ASSERT_TRUE(test::flip_byte(e.path().string(), fs::file_size(e.path()) / 2));
    ++files;
  }
  ASSERT_EQ(files, 1u);
  LayerQueueLoader loader(store, 1, at::kCPU, 1);
  loader.enqueue(0, {"bad", "good", "absent"});
  const auto l0 = loader.wait(0);
  ASSERT_EQ(l0.errors.size(), 3u);
  ASSERT_TRUE(l0.errors[0]);
  EXPECT_THROW(std::rethrow_exception(l0.errors[0]), CorruptData);
  EXPECT_FALSE(l0.errors[1]);
  EXPECT_TRUE(test::blocks_bit_equal(l0.blocks[1], good));
  ASSERT_TRUE(l0.errors[2]);
  EXPECT_THROW(std::rethrow_exception(l0.errors[2]), Error);
  loader.finish();
  fs::remove_all(dir);
}

TEST(LayerQueueLoader, LookaheadOneLoadsOnlyTheNextLayerAndNoLimitLoadsEverything) {
  StoreConfig cfg;
  BlockStore store(cfg);
  for (int i = 0; i < 4; ++i) store.put(test::random_block("b" + std::to_string(i), 1, 2, 4, 8, at::kFloat), Tier::Host);
  for (int lookahead : {1, -1}) {
    LayerQueueLoader loader(store, 4, at::kCPU, lookahead);
    for (int l = 0; l < 4; ++l) loader.enqueue(l, {"b" + std::to_string(l)});
    loader.wait(0);
    // At layer 0 with lookahead 1 only layer 1 may load: layers 2 and 3 stay queued.
    EXPECT_EQ(settle(loader, lookahead == 1 ? 2 : 0), lookahead == 1 ? 2u : 0u) << lookahead;
    loader.wait(1);
    EXPECT_EQ(settle(loader, lookahead == 1 ? 1 : 0), lookahead == 1 ? 1u : 0u) << lookahead;
    loader.wait(2);
    loader.wait(3);
    EXPECT_EQ(loader.finish().blocks, 4);
  }
}

TEST(LayerQueueLoader, IdleTimeIsChargedToTheLayerTheConsumerIsAt) {
  StoreConfig cfg;
  BlockStore store(cfg);
  store.put(test::random_block("b", 1, 2, 4, 8, at::kFloat), Tier::Host);
  LayerQueueLoader loader(store, 3, at::kCPU, 1);
  loader.wait(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // "computing" layer 0, nothing to load
  loader.enqueue(2, {"b"});
  loader.wait(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // layer 2's block loads, then idle
  loader.wait(2);
  const auto st = loader.finish();
  EXPECT_GE(st.idle_s[0], 0.05);
  EXPECT_GE(st.idle_s[1] + st.busy_s[1], 0.05);
  EXPECT_LT(st.idle_s[2], 0.05);
  EXPECT_EQ(st.blocks, 1);
}

TEST(LayerQueueLoader, ACappedThroughputTakesAtLeastBytesOverTheCap) {
  StoreConfig cfg;
  BlockStore store(cfg);
  const Block b = test::random_block("b", 1, 2, 100, 32, at::kFloat);  // ~26 KB
  store.put(b, Tier::Host);
  for (double cap : {0.0, 1e6}) {
    LayerQueueLoader loader(store, 2, at::kCPU, -1, cap);
    const auto t0 = std::chrono::steady_clock::now();
    loader.enqueue(0, {"b", "b"});
    loader.enqueue(1, {"b", "b"});
    loader.wait(0);
    loader.wait(1);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto st = loader.finish();
    if (cap > 0) EXPECT_GE(s, 4.0 * b.nbytes() / cap * 0.99) << "4 blocks through a 1 MB/s link";
    else EXPECT_LT(s, 4.0 * b.nbytes() / 1e6) << "uncapped, host memory";
    EXPECT_EQ(st.bytes, 4 * b.nbytes());
  }
}

// How many of the file's pages are in the page cache, or -1 when it cannot tell.
long resident_pages(const std::string& path) {
  const size_t size = fs::file_size(path);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec((size + page - 1) / page);
  long n = -1;
  if (::mincore(p, size, vec.data()) == 0) {
    n = 0;
    for (unsigned char c : vec) n += c & 1;
  }
  ::munmap(p, size);
  return n;
}

TEST(BlockStore, DropSpillPagesLeavesAWrittenSpillFileOutOfThePageCache) {
  const std::string dir = fresh_dir("wm_test_cold_spill");
  struct statfs sf;
  if (::statfs(dir.c_str(), &sf) == 0 && sf.f_type == 0x01021994)  // TMPFS_MAGIC
    GTEST_SKIP() << dir << " is on tmpfs, whose pages cannot be dropped";
  const Block b = test::random_block("big", 2, 4, 2048, 64, at::kFloat);  // ~8 MiB
  for (bool drop : {false, true}) {
    StoreConfig cfg;
    cfg.spill_dir = dir;
    cfg.drop_spill_pages = drop;
    BlockStore store(cfg);
    store.put(b, Tier::Disk);
    std::string path;
    for (const auto& e : fs::directory_iterator(dir)) path = e.path().string();
    ASSERT_FALSE(path.empty());
    const long pages = resident_pages(path);
    if (pages < 0) GTEST_SKIP() << "mincore is not available here";
    if (drop) EXPECT_LT(pages, 8) << "pages still cached after the drop";
    else EXPECT_GT(pages, 8) << "a file just written is normally in the page cache";
    EXPECT_TRUE(test::blocks_bit_equal(store.get("big"), b));  // and it reads back whole
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wm
