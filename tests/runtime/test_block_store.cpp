#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "runtime/block_store.h"
#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/spill_file.h"
#include "test_util.h"
#include "tests/temp_dir.h"

namespace wm {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  return wm::testing::make_temp_dir("wm_test_" + name + "_").string();
}

TEST(SpillFile, RoundTripIsBitExact) {
  const std::string dir = temp_dir("spill");
  for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    Block b = test::random_block("chunk:7", 3, 2, 11, 16, dt, 3, /*ragged=*/true);
    b.meta.embedding = at::randn({5});
    b.meta.pinned = true;
    b.meta.created = 99;
    b.stats.attn_ema = 0.123456789012345;
    const std::string path = dir + "/b.wmkv";
    write_spill_file(path, b);
    Block r = read_spill_file(path);
    EXPECT_TRUE(test::blocks_bit_equal(b, r));
    EXPECT_TRUE(test::bit_equal(b.meta.embedding, r.meta.embedding));
    EXPECT_EQ(test::payload_values(r.meta), (std::vector<double>{1.5, -2.25, 0.125}));
    EXPECT_NE(r.meta.payload, b.meta.payload);  // decoded from the file, not shared
    EXPECT_EQ(r.meta.kind, "chunk");
    EXPECT_TRUE(r.meta.pinned);
    EXPECT_EQ(r.meta.created, 99);
    EXPECT_EQ(r.stats.attn_ema, b.stats.attn_ema);
    EXPECT_EQ(r.stats.uses, 3);
  }
  fs::remove_all(dir);
}

// A block that holds no tokens of some layers (a policy's block of one layer) round-trips
// through a spill file too: an empty tensor needs no payload bytes.
TEST(SpillFile, EmptyLayersRoundTrip) {
  const std::string dir = temp_dir("spill_empty");
  Block b = test::random_block("keep:1", 3, 2, 5, 8, at::kFloat, 1, /*ragged=*/false);
  for (int l : {1, 2}) {  // the last tensors: nothing of the payload is left for them
    b.layers[l].k = at::empty({2, 0, 8});
    b.layers[l].v = at::empty({2, 0, 8});
    b.layers[l].pos = at::empty({0, b.layers[l].pos.size(1)}, at::kLong);
    b.layers[l].logw = at::empty({0});
  }
  const std::string path = dir + "/e.wmkv";
  write_spill_file(path, b);
  Block r = read_spill_file(path);
  EXPECT_TRUE(test::blocks_bit_equal(b, r));
  EXPECT_EQ(r.layers[0].k.size(1), 5);
  EXPECT_EQ(r.layers[2].k.size(1), 0);
  fs::remove_all(dir);
}

// A payload type nobody registered: the file is sound, so the error is not CorruptData, and it
// names the file and the type.
TEST(SpillFile, PayloadOfAnUnregisteredTypeIsANamedError) {
  struct Unknown final : BlockPayload {
    std::string type() const override { return "test.unregistered"; }
    nlohmann::json to_json() const override { return {{"x", 1}}; }
  };
  const std::string dir = temp_dir("unknown_payload");
  Block b = test::random_block("u", 1, 2, 4, 8, at::kFloat);
  b.meta.payload = std::make_shared<Unknown>();
  const std::string path = dir + "/u.wmkv";
  write_spill_file(path, b);
  try {
    read_spill_file(path);
    ADD_FAILURE() << "a payload without a decoder was read";
  } catch (const CorruptData& e) {
    ADD_FAILURE() << "CorruptData for a sound file: " << e.what();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("test.unregistered"), std::string::npos) << what;
    EXPECT_NE(what.find("test.values"), std::string::npos) << what;  // the registered ones are listed
  }
  EXPECT_THROW(register_block_payload("test.values", [](const nlohmann::json&) -> std::shared_ptr<const BlockPayload> {
                 return nullptr;
               }),
               Error);  // one decoder per type
  fs::remove_all(dir);
}

TEST(SpillFile, CorruptionAndTruncationAreDetected) {
  const std::string dir = temp_dir("corrupt");
  Block b = test::random_block("x", 2, 2, 8, 8, at::kFloat);
  const std::string path = dir + "/x.wmkv";
  const size_t size = write_spill_file(path, b);
  ASSERT_EQ(fs::file_size(path), size);
  // Flip one bit at several places: header, payload, checksum.
  for (size_t at : {size_t{20}, size / 2, size - 3}) {
    write_spill_file(path, b);
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(at));
      char c;
      f.read(&c, 1);
      c ^= 0x10;
      f.seekp(static_cast<std::streamoff>(at));
      f.write(&c, 1);
    }
    EXPECT_THROW(read_spill_file(path), CorruptData) << "flip at " << at;
  }
  write_spill_file(path, b);
  fs::resize_file(path, size - 100);
  EXPECT_THROW(read_spill_file(path), CorruptData);
  fs::resize_file(path, 10);
  EXPECT_THROW(read_spill_file(path), CorruptData);
  EXPECT_THROW(read_spill_file(dir + "/absent.wmkv"), Error);
  fs::remove_all(dir);
}

// A spill file from a header's text and payload bytes, framed and checksummed as the writer
// does, so only the header's claims are wrong.
void write_framed(const std::string& path, const std::string& header, const std::string& payload) {
  std::string out("WMKVBLK1", 8);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  out += header;
  out += payload;
  Xxh64 sum;
  sum.update(header.data(), header.size());
  sum.update(payload.data(), payload.size());
  const uint64_t d = sum.digest();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(d >> (8 * i)));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

// Every claim of the header is checked before anything is allocated: shapes that are negative,
// overflow, or need more bytes than the file holds, and fields of the wrong type, are all
// CorruptData (a 16-byte payload declaring [2^33] floats must not ask for 32 GiB).
TEST(SpillFile, LyingHeadersAreCorruptDataBeforeAllocation) {
  const std::string dir = temp_dir("lying");
  const std::string path = dir + "/x.wmkv";
  auto header = [](const std::string& tensor, const std::string& payload_bytes = "16",
                   const std::string& n_layers = "0", const std::string& block_payload = "null") {
    return R"({"id":"x","n_layers":)" + n_layers + R"(,"kind":"chunk","meta_payload":)" + block_payload +
           R"(,"priority":0,"pinned":false,"created":0,"has_embedding":true,"attn_ema":0,"last_use":0,"uses":0,)" +
           R"("payload_bytes":)" + payload_bytes + R"(,"tensors":[)" + tensor + "]}";
  };
  // The frame itself is sound: a well-formed header with the same payload reads back.
  const std::string f32x4 = R"({"dtype":"F32","shape":[4],"offset":0})";
  write_framed(path, header(f32x4), std::string(16, '\0'));
  EXPECT_EQ(read_spill_file(path).meta.embedding.numel(), 4);
  write_framed(path, header(f32x4, "16", "0", R"({"type":"test.values","data":[0.5,2]})"), std::string(16, '\0'));
  EXPECT_EQ(test::payload_values(read_spill_file(path).meta), (std::vector<double>{0.5, 2}));
  const std::vector<std::string> lies = {
      header(R"({"dtype":"F32","shape":[8589934592],"offset":0})"),
      header(R"({"dtype":"F32","shape":[-4],"offset":0})"),
      header(R"({"dtype":"F32","shape":[4611686018427387904,4],"offset":0})"),
      header(R"({"dtype":"F32","shape":[4294967296,4294967296],"offset":0})"),
      header(R"({"dtype":"F32","shape":[4],"offset":"0"})"),
      header(R"({"dtype":32,"shape":[4],"offset":0})"),
      header(R"({"dtype":"F32","shape":[4.5],"offset":0})"),
      header(R"({"dtype":"F32","shape":[4],"offset":0})", "17"),
      header(R"({"dtype":"F32","shape":[4],"offset":0})", "-16"),
      header(R"({"dtype":"F32","shape":[4],"offset":0})", "16", "4611686018427387904"),
      header(R"({"dtype":"F32","shape":[4],"offset":0})", "16", "-1"),
      header(R"({"dtype":"F32","shape":[2],"offset":0},{"dtype":"F32","shape":[2],"offset":4})"),
      header(f32x4, "16", "0", R"({"data":[1]})"),
      header(f32x4, "16", "0", R"({"type":7,"data":[1]})"),
      header(f32x4, "16", "0", R"([1])"),
      header(f32x4, "16", "0", R"({"type":"test.values","data":"not numbers"})"),
  };
  for (const auto& h : lies) {
    write_framed(path, h, std::string(16, '\0'));
    try {
      read_spill_file(path);
      ADD_FAILURE() << "accepted " << h;
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << h << " gave a non-CorruptData error: " << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(BlockStore, EvictToHostAndDiskThenRestoreBitExact) {
  const std::string dir = temp_dir("store");
  StoreConfig cfg;
  cfg.spill_dir = dir;
  BlockStore store(cfg);
  Block a = test::random_block("a", 4, 2, 20, 32, at::kHalf, 3, true);
  Block b = test::random_block("b", 4, 2, 20, 32, at::kFloat, 3, false);
  store.put(a, Tier::Host);
  store.put(b, Tier::Disk);
  EXPECT_EQ(store.tier_of("a"), Tier::Host);
  EXPECT_EQ(store.tier_of("b"), Tier::Disk);
  EXPECT_EQ(store.bytes(Tier::Host), a.nbytes());
  EXPECT_EQ(store.bytes(Tier::Disk), b.nbytes());
  EXPECT_TRUE(test::blocks_bit_equal(store.get("a"), a));
  EXPECT_TRUE(test::blocks_bit_equal(store.get("b"), b));
  EXPECT_TRUE(test::blocks_bit_equal(store.fetch_async("b").get(), b));
  EXPECT_EQ(test::payload_values(store.meta("b")), test::payload_values(b.meta));
  EXPECT_EQ(test::payload_values(store.get("b").meta), test::payload_values(b.meta));  // from the disk tier
  Block t = store.take("b");
  EXPECT_TRUE(test::blocks_bit_equal(t, b));
  EXPECT_FALSE(store.contains("b"));
  EXPECT_EQ(store.bytes(Tier::Disk), 0u);
  EXPECT_THROW(store.get("b"), Error);
  fs::remove_all(dir);
}

TEST(BlockStore, BudgetsHoldUnderRandomPutsAndGets) {
  const std::string dir = temp_dir("budget");
  const size_t one = test::random_block("p", 2, 2, 16, 8, at::kFloat).nbytes();
  StoreConfig cfg;
  cfg.spill_dir = dir;
  cfg.device_budget = 3 * one + one / 2;
  cfg.host_budget = 5 * one;
  cfg.disk_budget = 40 * one;
  BlockStore store(cfg);
  std::mt19937 rng(12345);
  std::map<std::string, Block> truth;
  for (int step = 0; step < 300; ++step) {
    const int op = rng() % 3;
    if (op < 2 || truth.empty()) {
      const std::string id = "blk" + std::to_string(rng() % 30);
      const int n = 4 + rng() % 24;  // blocks of different sizes
      Block b = test::random_block(id, 2, 2, n, 8, at::kFloat, 1, rng() % 2 == 0);
      b.meta.pinned = rng() % 10 == 0;
      const Tier t = static_cast<Tier>(rng() % 3);
      try {
        store.put(b, t);
        truth[id] = b;
      } catch (const Error&) {
        truth.erase(id);  // a re-put of an id replaces it first
        ASSERT_FALSE(store.contains(id));
      }
    } else if (op == 2) {
      auto it = truth.begin();
      std::advance(it, rng() % truth.size());
      ASSERT_TRUE(test::blocks_bit_equal(store.get(it->first), it->second)) << it->first;
      if (rng() % 4 == 0) {
        store.erase(it->first);
        truth.erase(it);
      }
    }
    ASSERT_LE(store.bytes(Tier::Device), cfg.device_budget) << "step " << step;
    ASSERT_LE(store.bytes(Tier::Host), cfg.host_budget) << "step " << step;
    ASSERT_LE(store.bytes(Tier::Disk), cfg.disk_budget) << "step " << step;
    ASSERT_EQ(store.size(), truth.size());
  }
  // Nothing was lost: every block comes back bit-exact from whichever tier holds it.
  size_t on_disk = 0;
  for (auto& [id, b] : truth) {
    EXPECT_TRUE(test::blocks_bit_equal(store.get(id), b)) << id;
    on_disk += store.tier_of(id) == Tier::Disk;
  }
  EXPECT_GT(on_disk, 0u);
  EXPECT_EQ(store.count(Tier::Device) + store.count(Tier::Host) + store.count(Tier::Disk), truth.size());
  fs::remove_all(dir);
}

TEST(BlockStore, LeastRecentlyUsedIsDemotedFirst) {
  const std::string dir = temp_dir("lru");
  const size_t one = test::random_block("p", 1, 1, 8, 8, at::kFloat).nbytes();
  StoreConfig cfg;
  cfg.spill_dir = dir;
  cfg.device_budget = 2 * one;
  BlockStore store(cfg);
  store.put(test::random_block("a", 1, 1, 8, 8, at::kFloat));
  store.put(test::random_block("b", 1, 1, 8, 8, at::kFloat));
  store.get("a");  // b is now the least recently used
  store.put(test::random_block("c", 1, 1, 8, 8, at::kFloat));
  EXPECT_EQ(store.tier_of("a"), Tier::Device);
  EXPECT_EQ(store.tier_of("b"), Tier::Host);
  EXPECT_EQ(store.tier_of("c"), Tier::Device);
  fs::remove_all(dir);
}

TEST(BlockStore, FullStoreThrowsAndCorruptSpillIsReported) {
  const std::string dir = temp_dir("full");
  const size_t one = test::random_block("p", 1, 1, 8, 8, at::kFloat).nbytes();
  StoreConfig cfg;
  cfg.spill_dir = dir;
  cfg.device_budget = one;
  cfg.host_budget = 0;
  cfg.disk_budget = one;
  BlockStore store(cfg);
  store.put(test::random_block("a", 1, 1, 8, 8, at::kFloat));
  store.put(test::random_block("b", 1, 1, 8, 8, at::kFloat));  // a goes to disk
  EXPECT_EQ(store.tier_of("a"), Tier::Disk);
  EXPECT_THROW(store.put(test::random_block("c", 1, 1, 8, 8, at::kFloat)), Error);
  EXPECT_TRUE(store.contains("a"));
  EXPECT_TRUE(store.contains("b"));
  // Damage a's spill file (every bit of one payload byte flipped, and checked to be written):
  // get() reports it instead of returning garbage.
  int damaged = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    const auto at = static_cast<std::streamoff>(fs::file_size(e.path()) - 20);
    char before = 0, after = 0;
    {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      ASSERT_TRUE(f.seekg(at).get(before)) << e.path();
      ASSERT_TRUE(f.seekp(at).put(static_cast<char>(~before))) << e.path();
    }
    std::ifstream g(e.path(), std::ios::binary);
    ASSERT_TRUE(g.seekg(at).get(after)) << e.path();
    ASSERT_EQ(after, static_cast<char>(~before)) << e.path();
    ++damaged;
  }
  ASSERT_EQ(damaged, 1) << "a's spill file should be the only file in " << dir;
  EXPECT_THROW(store.get("a"), CorruptData);
  fs::remove_all(dir);
}

// A spill file that cannot be written (the spill directory lies under a regular file): put()
// throws naming the block, and the block is not lost: it stays in host memory, bit-exact, over
// the host budget, with no bytes counted on disk and no file left behind.
TEST(BlockStore, FailedSpillWriteKeepsTheBlockInHostMemory) {
  const std::string dir = temp_dir("unwritable");
  { std::ofstream(dir + "/file") << "x"; }
  const size_t one = test::random_block("p", 1, 1, 8, 8, at::kFloat).nbytes();
  StoreConfig cfg;
  cfg.spill_dir = dir + "/file/spill";
  cfg.device_budget = one;
  cfg.host_budget = one;
  BlockStore store(cfg);
  const Block a = test::random_block("a", 1, 1, 8, 8, at::kFloat);
  const Block b = test::random_block("b", 1, 1, 8, 8, at::kFloat);
  const Block c = test::random_block("c", 1, 1, 8, 8, at::kFloat);
  store.put(a);
  store.put(b);  // a goes to host
  try {
    store.put(c);  // b goes to host, a to disk: its file cannot be written
    ADD_FAILURE() << "put() should have reported the failed spill";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block 'a'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.tier_of("a"), Tier::Host);
  EXPECT_EQ(store.tier_of("b"), Tier::Host);
  EXPECT_EQ(store.tier_of("c"), Tier::Device);
  EXPECT_EQ(store.bytes(Tier::Disk), 0u);
  EXPECT_EQ(store.count(Tier::Disk), 0u);
  EXPECT_EQ(store.bytes(Tier::Host), 2 * one);
  for (const Block* x : {&a, &b, &c}) EXPECT_TRUE(test::blocks_bit_equal(store.get(x->id), *x)) << x->id;
  EXPECT_TRUE(test::blocks_bit_equal(store.take("a"), a));
  EXPECT_EQ(store.bytes(Tier::Host), one);
  size_t entries = 0;
  for (const auto& f : fs::directory_iterator(dir)) entries += f.path().filename() != "file";
  EXPECT_EQ(entries, 0u);
  fs::remove_all(dir);
}

// Many threads put, replace, get (device and host), fetch_async, take, erase and read
// metadata on a few ids, with budgets small enough that blocks keep moving host -> disk.
// Every block read back is whole: its tensors and metadata carry the same version stamp, and
// no read fails except with "no block" for an id erased meanwhile. Built with
// -DWM_SANITIZE=thread this is the store's ThreadSanitizer check.
TEST(BlockStore, ConcurrentUseKeepsBlocksWhole) {
  const std::string dir = temp_dir("concurrent");
  StoreConfig cfg;
  const size_t one = test::random_block("p", 2, 2, 8, 8, at::kFloat).nbytes();
  cfg.device_budget = 2 * one;
  cfg.host_budget = 3 * one;
  cfg.spill_dir = dir;
  BlockStore store(cfg);
  constexpr int kIds = 4, kThreads = 4, kOps = 1500;
  auto stamped = [&](int id, int version) {
    Block b = test::random_block("blk:" + std::to_string(id), 2, 2, 8, 8, at::kFloat);
    for (auto& l : b.layers) l.k.fill_(static_cast<double>(version));
    b.meta.priority = version;
    return b;
  };
  auto whole = [](const Block& b) {
    for (const auto& l : b.layers)
      if (!at::all(l.k == b.meta.priority).item<bool>()) return false;
    return true;
  };
  std::atomic<int> broken{0}, unexpected{0}, reads{0};
  auto worker = [&](int seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < kOps; ++i) {
      const int id = static_cast<int>(rng() % kIds);
      const std::string name = "blk:" + std::to_string(id);
      try {
        switch (rng() % 8) {
          case 0:
          case 1: store.put(stamped(id, seed * 100000 + i), rng() % 2 ? Tier::Device : Tier::Host); break;
          case 2: broken += !whole(store.get(name)), ++reads; break;
          case 3: broken += !whole(store.get_host(name)), ++reads; break;
          case 4: broken += !whole(store.fetch_async(name).get()), ++reads; break;
          case 5: {
            const BlockMeta m = store.meta(name);  // copied while others replace and erase it
            broken += m.kind != "chunk";
            (void)store.contains(name), (void)store.size();
            break;
          }
          case 6: if (rng() % 4 == 0) broken += !whole(store.take(name)); else store.erase(name); break;
          default: (void)store.ids(), (void)store.bytes(Tier::Disk), (void)store.count(Tier::Host); break;
        }
      } catch (const Error& e) {
        if (std::string(e.what()).find("no block") == std::string::npos) {
          ++unexpected;
          ADD_FAILURE() << e.what();
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t + 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(broken.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(reads.load(), kThreads * kOps / 8);
  EXPECT_LE(store.bytes(Tier::Device), cfg.device_budget);
  EXPECT_LE(store.bytes(Tier::Host), cfg.host_budget);
  for (const auto& id : store.ids()) EXPECT_TRUE(whole(store.get(id))) << id;
  // Only the disk tier's blocks have files; none is left behind by a replaced or erased block.
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += f.path().extension() == ".wmkv";
  EXPECT_EQ(files, store.count(Tier::Disk));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wm
