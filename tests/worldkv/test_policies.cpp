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
#include "tests/temp_dir.h"
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

// window_chunks says, without tensors, which chunks the memory holds where: for every
// registered policy, with and without fill_by_tokens, and with other region sizes, its sink,
// recent and bank are those of a memory run chunk by chunk, and the retrieved region holds as
// many banked chunks as it has slots (or as are banked).
TEST(WorldKvPolicies, WindowChunksIsTheWindowTheMemoryBuilds) {
  Synthetic s;
  auto ids = [](const std::vector<int64_t>& chunks) {
    std::vector<std::string> out;
    for (int64_t c : chunks) out.push_back(WorldMemory::chunk_id(c));
    return out;
  };
  auto index_order = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) {
      return std::stoll(a.substr(a.find(':') + 1)) < std::stoll(b.substr(b.find(':') + 1));
    });
    return v;
  };
  for (const std::string& name : policy_names())
    for (bool fill : {false, true})
      for (int sizes : {0, 1}) {
        SCOPED_TRACE(name + (fill ? " fill_by_tokens" : "") + (sizes ? " 2|6|2 chunks" : " 1|3|1 chunks"));
        MemoryConfig cfg;
        cfg.tokens_per_frame = s.tpf;
        cfg.policy = Policy(name);
        cfg.fill_by_tokens = fill;
        if (sizes) cfg.sink_frames = 6, cfg.retrieved_frames = 18, cfg.recent_frames = 6;
        WorldMemory mem(s.spec, cfg);
        const int expected_slots = !mem.policy().banks() ? 0
                                   : name == "worldkv_c" && fill ? (sizes ? 12 : 6)  // 6 tokens a compressed chunk
                                                                 : (sizes ? 6 : 3);
        for (int64_t i = 0; i < 16; ++i) {
          mem.prepare(i, poses_at(i % 5, 0.2 * i));
          const WindowChunks w = window_chunks(cfg, i);
          const WindowChunks own = mem.window_chunks(i);
          EXPECT_EQ(own.sink, w.sink);
          EXPECT_EQ(own.banked, w.banked);
          EXPECT_EQ(own.recent, w.recent);
          EXPECT_EQ(own.retrieved_slots, w.retrieved_slots);
          EXPECT_EQ(w.retrieved_slots, expected_slots);
          const auto regions = mem.policy().regions();
          auto region = [&](const std::string& r) {
            return std::find(regions.begin(), regions.end(), r) == regions.end() ? std::vector<std::string>{}
                                                                                   : mem.region_ids(r);
          };
          EXPECT_EQ(region("sink"), ids(w.sink)) << "chunk " << i;
          EXPECT_EQ(region("recent"), ids(w.recent)) << "chunk " << i;
          const std::vector<std::string> banked = ids(w.banked);
          EXPECT_EQ(index_order(mem.bank().ids()), banked) << "chunk " << i;
          const std::vector<std::string> retrieved = region("retrieved");
          EXPECT_EQ(retrieved.size(), std::min<size_t>(w.retrieved_slots, w.banked.size())) << "chunk " << i;
          for (auto& id : retrieved) EXPECT_NE(std::find(banked.begin(), banked.end(), id), banked.end()) << id;
          // Every chunk before i is in exactly one place: sink, bank or recent (or gone, for a
          // policy that drops what leaves recent).
          EXPECT_LE(w.sink.size() + w.banked.size() + w.recent.size(), static_cast<size_t>(i));
          if (mem.policy().banks() || mem.policy().recent_capacity() < 0)
            EXPECT_EQ(w.sink.size() + w.banked.size() + w.recent.size(), static_cast<size_t>(i));
          mem.commit(i, s.chunk(i, 3), poses_at(i % 5, 0.2 * i));
        }
      }
  MemoryConfig bad;
  EXPECT_THROW(window_chunks(bad, 3), Error);  // tokens_per_frame missing
  bad.tokens_per_frame = s.tpf;
  EXPECT_THROW(window_chunks(bad, -1), Error);
  EXPECT_EQ(window_chunks(bad, 0).sink.size() + window_chunks(bad, 0).recent.size(), 0u);
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
  const std::string dir = wm::testing::make_temp_dir("wm_test_chunk_payload_").string();
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
