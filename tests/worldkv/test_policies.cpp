#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/spill_file.h"
#include "synthetic.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {
namespace {

TEST(WorldKvPolicies, UnknownNameIsAnErrorListingTheRegisteredOnes) {
  const std::vector<std::string> names = policy_names();
  ASSERT_FALSE(names.empty());
  for (auto bad : {"lru", "", "WorldKv", "worldkv "}) {
    try {
      parse_policy(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(str_cat("'", bad, "'")), std::string::npos) << what;
      for (auto& n : names) EXPECT_NE(what.find(n), std::string::npos) << what << " does not list " << n;
    }
    EXPECT_THROW(Policy{bad}, Error);
  }
}

TEST(WorldKvPolicies, BuiltInsAreRegistered) {
  const std::vector<std::string> names = policy_names();
  for (const Policy& p : {Policy::FullKv, Policy::SlidingWindow, Policy::SinkRecent, Policy::WorldKv, Policy::WorldKvC,
                          Policy::WorldKvAttn}) {
    EXPECT_NE(std::find(names.begin(), names.end(), p.name()), names.end()) << p.name();
    EXPECT_EQ(parse_policy(p.name()), p);
  }
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());  // no name twice
  EXPECT_TRUE(banks(Policy::WorldKvC));
  EXPECT_FALSE(banks(Policy::SinkRecent));
}

// Every registered policy, by its name alone: it lays out its regions, keeps the window bounded
// (but full_kv), banks iff it says so, retrieves into the retrieved region when it has one, and
// every chunk in the window or the bank carries its metadata.
TEST(WorldKvPolicies, EveryRegisteredPolicyRunsPrepareAndCommit) {
  Synthetic s;
  for (const std::string& name : policy_names()) {
    SCOPED_TRACE(name);
    MemoryConfig cfg;
    cfg.tokens_per_frame = s.tpf;
    cfg.policy = Policy(name);
    WorldMemory mem(s.spec, cfg);
    const auto regions = mem.policy().regions();
    EXPECT_EQ(mem.window().layout().region_names(), regions);
    EXPECT_EQ(mem.policy().banks(), banks(cfg.policy));
    const int n = 10;
    for (int64_t i = 0; i < n; ++i) {
      mem.prepare(i, poses_at(i % 4, 0.3 * i));
      if (mem.policy().banks() && i >= 3) {
        EXPECT_FALSE(mem.last_retrieval().empty()) << "chunk " << i;
        EXPECT_EQ(mem.region_ids("retrieved").size(), mem.last_retrieval().size()) << "chunk " << i;
      }
      mem.commit(i, s.chunk(i, 3), poses_at(i % 4, 0.3 * i));
      if (mem.policy().recent_capacity() > 0) {
        EXPECT_LE(mem.window().size(0), (cfg.sink_frames + cfg.retrieved_frames + cfg.recent_frames) * s.tpf);
      }
    }
    size_t in_window = 0;
    for (auto& r : regions)
      for (auto& id : mem.region_ids(r)) {
        ++in_window;
        const BlockMeta& m = mem.window().meta(id);
        const int64_t index = std::stoll(id.substr(id.find(':') + 1));
        EXPECT_EQ(m.kind, "chunk");
        EXPECT_EQ(m.created, index);
        EXPECT_EQ(chunk_payload(m, id).first_frame(), index * 3);
        EXPECT_EQ(chunk_payload(m, id).pose().x, index % 4);
      }
    const int kept = mem.policy().sink_capacity() + mem.policy().recent_capacity();  // what never leaves
    if (mem.policy().banks()) {
      EXPECT_EQ(mem.bank().size(), static_cast<size_t>(n - kept));
      for (auto& id : mem.bank().ids()) {
        const int64_t index = std::stoll(id.substr(id.find(':') + 1));
        EXPECT_EQ(chunk_payload(mem.bank().meta(id), id).first_frame(), index * 3);
      }
    } else {
      EXPECT_EQ(mem.bank().size(), 0u);
      EXPECT_TRUE(mem.last_retrieval().empty());
      EXPECT_EQ(in_window, static_cast<size_t>(mem.policy().recent_capacity() < 0 ? n : std::min(n, kept)));
    }
  }
}

// A chunk's metadata (its pose above all) reaches the bank from the window: nothing else holds
// it on the way.
TEST(WorldKvPolicies, EvictedChunksKeepTheirPoseInTheBank) {
  Synthetic s;
  MemoryConfig cfg;
  cfg.tokens_per_frame = s.tpf;
  cfg.policy = Policy::WorldKvAttn;
  WorldMemory mem(s.spec, cfg);
  for (int64_t i = 0; i < 6; ++i) {
    mem.prepare(i, poses_at(2.0 * i, 0.1 * i));
    mem.commit(i, s.chunk(i, 3), poses_at(2.0 * i, 0.1 * i));
  }
  for (int64_t i = 1; i < 5; ++i) {  // chunk 0 is the sink, chunk 5 recent
    const std::string id = WorldMemory::chunk_id(i);
    const BlockMeta m = mem.bank().meta(id);
    EXPECT_EQ(chunk_payload(m, id).pose().x, 2.0 * i);
    EXPECT_NEAR(chunk_payload(m, id).pose().yaw, 0.1 * i, 1e-12);
    EXPECT_EQ(m.created, i);
    ASSERT_TRUE(m.embedding.defined());  // worldkv_attn's key summary, made on admission
    EXPECT_EQ(m.embedding.sizes().vec(), (std::vector<int64_t>{2, 2, 12}));
  }
}

TEST(WorldKvPolicies, ChunkPayloadSurvivesASpillFile) {
  Synthetic s;
  const std::string dir = (std::filesystem::temp_directory_path() / "wm_test_chunk_payload").string();
  std::filesystem::create_directories(dir);
  Block b;
  b.id = "chunk:7";
  b.layers = s.chunk(7, 3);
  for (auto& l : b.layers) l.logw = at::zeros({l.k.size(1)});
  const Pose pose{1.0 / 3, -2.5, 0.125, 2.9, -0.4};
  b.meta.kind = "chunk";
  b.meta.created = 7;
  b.meta.payload = std::make_shared<ChunkPayload>(pose, 21);
  write_spill_file(dir + "/c.wmkv", b);
  const Block r = read_spill_file(dir + "/c.wmkv");
  const ChunkPayload* p = r.meta.payload_as<ChunkPayload>();
  ASSERT_NE(p, nullptr);
  EXPECT_NE(static_cast<const BlockPayload*>(p), b.meta.payload.get());
  EXPECT_EQ(to_vector(p->pose()), to_vector(pose));  // bit-exact through JSON
  EXPECT_EQ(p->first_frame(), 21);
  EXPECT_EQ(r.meta.created, 7);
  EXPECT_THROW(ChunkPayload::from_json(nlohmann::json{{"pose", {1, 2}}, {"first_frame", 0}}), CorruptData);
  EXPECT_THROW(chunk_payload(BlockMeta{}, "chunk:9"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wm::worldkv
