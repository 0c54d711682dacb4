#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <set>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/rope.h"
#include "worldkv/compression.h"
#include "worldkv/pose_index.h"
#include "worldkv/world_memory.h"
#include "synthetic.h"
#include "tests/temp_dir.h"

namespace wm::worldkv {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace worldkv_test {

constexpr double kPi = 3.14159265358979323846;

TEST(WorldKvPose, MeanWrapsYawAndGeodesicIsSymmetric) {
  Pose a{0, 0, 0, kPi - 0.1, 0}, b{2, 4, 0, -kPi + 0.1, 0};
  Pose m = mean_pose({a, b});
  EXPECT_NEAR(std::abs(m.yaw), kPi, 1e-9);
  EXPECT_NEAR(m.x, 1, 1e-12);
  EXPECT_NEAR(m.y, 2, 1e-12);
  EXPECT_NEAR(geodesic_angle(a, b), 0.2, 1e-9);
  EXPECT_NEAR(geodesic_angle(b, a), 0.2, 1e-9);
  Pose c{0, 0, 0, 0.3, 0.2};
  Pose back = mean_pose({c});
  EXPECT_NEAR(back.yaw, 0.3, 1e-9);
  EXPECT_NEAR(back.pitch, 0.2, 1e-9);
}

TEST(WorldKvPoseIndex, NearestIsTheMatchingPose) {
  PoseIndex idx;
  for (int i = 0; i < 10; ++i) idx.add("chunk:" + std::to_string(i), Pose{i * 1.0, 0, 0, i * 0.5, 0});
  auto r = idx.nearest(Pose{4.0, 0, 0, 2.0, 0}, 3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].id, "chunk:4");
  EXPECT_DOUBLE_EQ(r[0].distance, 0.0);
  EXPECT_LE(r[0].distance, r[1].distance);
  // Excluded chunks are not candidates.
  auto e = idx.nearest(Pose{4.0, 0, 0, 2.0, 0}, 1, {"chunk:4"});
  EXPECT_NE(e[0].id, "chunk:4");
  // Same place, other direction: rotation counts as much as translation.
  PoseIndex two;
  two.add("same_place_turned", Pose{0, 0, 0, kPi, 0});
  two.add("moved_same_dir", Pose{0.5, 0, 0, 0, 0});
  two.add("far", Pose{10, 0, 0, kPi / 2, 0});
  EXPECT_EQ(two.nearest(Pose{0, 0, 0, 0, 0}, 1)[0].id, "moved_same_dir");
}

TEST(WorldKvCompression, KeepsAnchorPlusLowestSimilarity) {
  at::manual_seed(5);
  const int64_t tpf = 16, frames = 3, H = 2, d = 8;
  at::Tensor k = at::randn({H, frames * tpf, d});
  for (bool per_frame : {false, true}) {
    CompressionConfig cfg;
    cfg.keep_ratio = 0.25;
    cfg.per_frame = per_frame;
    at::Tensor keep = compression_keep_indices(k, tpf, cfg);
    // Reference in double: cosine of each flattened key to the anchor frame's mean key.
    at::Tensor flat = k.to(at::kDouble).permute({1, 0, 2}).reshape({frames * tpf, H * d});
    at::Tensor anchor = flat.narrow(0, 0, tpf).mean(0);
    std::vector<std::pair<double, int64_t>> sims;
    for (int64_t i = tpf; i < frames * tpf; ++i) {
      at::Tensor x = flat[i];
      sims.push_back({(x * anchor).sum().item<double>() / (x.norm().item<double>() * anchor.norm().item<double>()), i});
    }
    std::set<int64_t> want;
    for (int64_t i = 0; i < tpf; ++i) want.insert(i);
    if (!per_frame) {
      const int64_t m = static_cast<int64_t>(std::ceil(0.25 * (frames - 1) * tpf));
      std::sort(sims.begin(), sims.end());
      for (int64_t j = 0; j < m; ++j) want.insert(sims[j].second);
      EXPECT_EQ(keep.size(0), tpf + m);
    } else {
      const int64_t m = static_cast<int64_t>(std::ceil(0.25 * tpf));
      for (int64_t f = 1; f < frames; ++f) {
        std::vector<std::pair<double, int64_t>> fs(sims.begin() + (f - 1) * tpf, sims.begin() + f * tpf);
        std::sort(fs.begin(), fs.end());
        for (int64_t j = 0; j < m; ++j) want.insert(fs[j].second);
      }
      EXPECT_EQ(keep.size(0), tpf + (frames - 1) * m);
    }
    std::vector<int64_t> got(keep.data_ptr<int64_t>(), keep.data_ptr<int64_t>() + keep.numel());
    EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()), want);
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  }
  // An odd count rounds up: 10 non-anchor tokens at r = 0.25 keep ceil(2.5) = 3.
  CompressionConfig cfg;
  at::Tensor small = at::randn({1, 15, 4});
  EXPECT_EQ(compression_keep_indices(small, 5, cfg).size(0), 5 + 3);
  EXPECT_THROW(compression_keep_indices(at::randn({1, 14, 4}), 5, cfg), Error);
}

// A chunk whose dropped tokens repeat kept keys: the anchor frame's 4 keys are random, 6 of the
// 8 others copy one of them (K only; their V are their own), and 2 point away from the anchor
// mean so that compression keeps them. Attention over the compressed chunk then equals attention
// over the whole chunk exactly under `merge` (identical keys share one softmax weight, so their
// V sum to the count times the mean), and not under `drop` or `votes`.
TEST(WorldKvCompression, MergeCountsAndAveragesWhatItLeavesOut) {
  at::manual_seed(11);
  const int64_t tpf = 4, frames = 3, n = tpf * frames, H = 2, d = 8;
  auto opt = at::TensorOptions().dtype(at::kFloat);
  at::Tensor k = at::empty({H, n, d}, opt);
  k.narrow(1, 0, tpf).copy_(at::randn({H, tpf, d}, opt));
  const std::vector<int64_t> copy_of = {0, 1, 2, -1, 3, 0, -1, 1};  // token tpf + j copies copy_of[j]; -1: away
  at::Tensor away = -k.narrow(1, 0, tpf).mean(1, true);
  for (int64_t j = 0; j < n - tpf; ++j)
    k.narrow(1, tpf + j, 1).copy_(copy_of[j] >= 0 ? k.narrow(1, copy_of[j], 1) : away + 0.01 * at::randn({H, 1, d}, opt));
  Block chunk;
  chunk.id = "chunk:0";
  chunk.layers.push_back({k, at::randn({H, n, d}, opt), at::zeros({n, 3}, at::kLong), at::zeros({n}, at::kFloat)});

  at::Tensor keep = compression_keep_indices(k, tpf, CompressionConfig{});
  ASSERT_EQ(keep.numel(), tpf + 2);
  EXPECT_TRUE(keep.equal(at::tensor(std::vector<int64_t>{0, 1, 2, 3, tpf + 3, tpf + 6})));
  // Each copy votes for its original, the kept tokens for themselves.
  at::Tensor target = vote_targets(k, keep);
  EXPECT_TRUE(target.equal(at::tensor(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 4, 3, 0, 5, 1})));
  EXPECT_THROW(vote_targets(k, at::tensor(std::vector<int64_t>{0, 12})), Error);
  EXPECT_THROW(vote_targets(k, at::tensor(std::vector<int64_t>{1, 1})), Error);

  at::Tensor q = at::randn({2 * H, 5, d}, opt);
  at::Tensor full = attention(q, k, chunk.layers[0].v, chunk.layers[0].logw).out;
  auto compressed_out = [&](MergeMode mode) {
    CompressionConfig cfg;
    cfg.merge = mode;
    Block c = compress_chunk(chunk, tpf, cfg);
    EXPECT_EQ(c.n_tokens(0), tpf + 2);
    EXPECT_TRUE(c.layers[0].k.equal(k.index_select(1, keep)));  // keys (and their positions) stay
    return std::make_pair(c, attention(q, c.layers[0].k, c.layers[0].v, c.layers[0].logw).out);
  };
  auto [merged, merged_out] = compressed_out(MergeMode::Merge);
  EXPECT_TRUE(at::allclose(merged_out, full, 1e-5, 1e-5)) << (merged_out - full).abs().max();
  // Token 0 stands for itself and two copies, token 3 for itself and one: log 3, log 2.
  at::Tensor want_logw = at::tensor(std::vector<float>{3, 3, 2, 2, 1, 1}).log();
  EXPECT_TRUE(at::allclose(merged.layers[0].logw, want_logw, 1e-6, 1e-7));
  auto [voted, voted_out] = compressed_out(MergeMode::Votes);
  EXPECT_TRUE(voted.layers[0].logw.equal(merged.layers[0].logw));
  EXPECT_TRUE(voted.layers[0].v.equal(chunk.layers[0].v.index_select(1, keep)));
  EXPECT_GT((voted_out - full).abs().max().item<double>(), 1e-3);
  auto [dropped, dropped_out] = compressed_out(MergeMode::Drop);
  EXPECT_TRUE(dropped.layers[0].logw.equal(at::zeros({tpf + 2}, at::kFloat)));
  EXPECT_GT((dropped_out - full).abs().max().item<double>(), 1e-3);

  // Weights already on the chunk add up (a merged entry of weight w counts as w tokens) and
  // weight the values' mean: the identity holds for a chunk of unequal weights too.
  Block heavy = chunk;
  heavy.layers[0].logw = at::rand({n}, at::kFloat).mul(3).log();
  CompressionConfig cfg;
  cfg.merge = MergeMode::Merge;
  Block hc = compress_chunk(heavy, tpf, cfg);
  at::Tensor want_w = at::zeros({tpf + 2}, at::kFloat).index_add_(0, target, heavy.layers[0].logw.exp());
  EXPECT_TRUE(at::allclose(hc.layers[0].logw, want_w.log(), 1e-5, 1e-6));
  at::Tensor heavy_full = attention(q, k, chunk.layers[0].v, heavy.layers[0].logw).out;
  at::Tensor heavy_out = attention(q, hc.layers[0].k, hc.layers[0].v, hc.layers[0].logw).out;
  EXPECT_TRUE(at::allclose(heavy_out, heavy_full, 1e-5, 1e-5)) << (heavy_out - heavy_full).abs().max();

  // Nothing left out (r = 1): the chunk comes back as it was.
  CompressionConfig all = cfg;
  all.keep_ratio = 1;
  Block same = compress_chunk(heavy, tpf, all);
  EXPECT_TRUE(same.layers[0].k.equal(k));
  EXPECT_TRUE(same.layers[0].v.equal(chunk.layers[0].v));
  EXPECT_TRUE(same.layers[0].logw.equal(heavy.layers[0].logw));

  EXPECT_EQ(parse_merge_mode("votes"), MergeMode::Votes);
  EXPECT_EQ(merge_mode_name(parse_merge_mode("merge")), "merge");
  EXPECT_THROW(parse_merge_mode("zip"), Error);
}

TEST(WorldKvMemory, RetrievesTheChunkSeenFromThisPose) {
  Synthetic s;
  MemoryConfig cfg;
  cfg.tokens_per_frame = s.tpf;
  cfg.policy = Policy::WorldKv;
  cfg.retrieved_frames = 3;  // one retrieved chunk makes the choice visible
  WorldMemory mem(s.spec, cfg);
  // Walk along x, looking along +x: chunk i at x = i.
  for (int64_t i = 0; i < 8; ++i) {
    mem.prepare(i, poses_at(i, 0));
    mem.commit(i, s.chunk(i, 3), poses_at(i, 0));
  }
  // Chunks 0 (sink), 7 (recent) are in the window; 1..6 are banked.
  EXPECT_EQ(mem.bank().size(), 6u);
  mem.prepare(8, poses_at(3.1, 0.05));
  ASSERT_EQ(mem.last_retrieval().size(), 1u);
  EXPECT_EQ(mem.last_retrieval()[0].id, "chunk:3");
  EXPECT_EQ(mem.region_ids("retrieved"), std::vector<std::string>{"chunk:3"});
  EXPECT_EQ(mem.region_ids("sink"), std::vector<std::string>{"chunk:0"});
  EXPECT_EQ(mem.region_ids("recent"), std::vector<std::string>{"chunk:7"});
}

TEST(WorldKvMemory, ReanchoredRetrievalEqualsRopeAtNewPositions) {
  at::manual_seed(9);
  Synthetic s;
  MemoryConfig cfg;
  cfg.tokens_per_frame = s.tpf;
  cfg.policy = Policy::WorldKv;
  cfg.placement = Placement::Reanchored;
  cfg.retrieved_frames = 3;
  WorldMemory mem(s.spec, cfg);
  std::vector<std::vector<at::Tensor>> raws;
  for (int64_t i = 0; i < 6; ++i) {
    raws.emplace_back();
    mem.prepare(i, poses_at(i, 0));
    mem.commit(i, s.chunk(i, 3, &raws.back()), poses_at(i, 0));
  }
  mem.prepare(6, poses_at(2, 0));  // chunk 2 comes back, just before recent (chunk 5, frames 15..17)
  ASSERT_EQ(mem.region_ids("retrieved"), std::vector<std::string>{"chunk:2"});
  const auto& lay = mem.window().layout();
  at::Tensor newpos = s.positions(2, 3);
  newpos.select(1, 0).add_(12 - 6);  // frames 6..8 move to 12..14
  for (int l = 0; l < 2; ++l) {
    const int64_t b = lay.segment_begin(l, "chunk:2"), n = lay.segment_len(l, "chunk:2");
    at::Tensor k = mem.window().k(l).narrow(1, b, n);
    EXPECT_LE((k - apply_rope(raws[2][l], newpos, s.spec.rope)).abs().max().item<float>(), 1e-5);
    EXPECT_TRUE(mem.window().pos(l).narrow(0, b, n).equal(newpos));
  }
}

TEST(WorldKvMemory, WindowBytesConstantExceptFullKv) {
  Synthetic s;
  for (auto policy : {Policy::SlidingWindow, Policy::SinkRecent, Policy::WorldKv, Policy::WorldKvC,
                      Policy::WorldKvAttn, Policy::FullKv}) {
    MemoryConfig cfg;
    cfg.tokens_per_frame = s.tpf;
    cfg.policy = policy;
    WorldMemory mem(s.spec, cfg);
    size_t bytes_at_10 = 0;
    for (int64_t i = 0; i < 120; ++i) {
      const double x = std::sin(i * 0.1) * 5;
      mem.prepare(i, poses_at(x, i * 0.2));
      mem.commit(i, s.chunk(i, 3), poses_at(x, i * 0.2));
      if (i == 10) bytes_at_10 = mem.window_bytes();
      if (policy != Policy::FullKv) {
        // Window: never more than sink + retrieved + recent = 15 frames of tokens.
        EXPECT_LE(mem.window().size(0), 15 * s.tpf) << policy_name(policy);
      }
    }
    if (policy == Policy::FullKv) {
      EXPECT_GT(mem.window_bytes(), 5 * bytes_at_10);
      EXPECT_EQ(mem.window().size(0), 120 * 3 * s.tpf);
    } else {
      EXPECT_EQ(mem.window_bytes(), bytes_at_10) << policy_name(policy);
      EXPECT_EQ(mem.peak_window_bytes(), bytes_at_10) << policy_name(policy);
    }
    if (banks(policy)) EXPECT_EQ(mem.bank().size(), 120u - 2u);
  }
}

TEST(WorldKvMemory, CompressedBankIsAboutHalf) {
  Synthetic s;
  size_t bytes[2];
  for (int c = 0; c < 2; ++c) {
    MemoryConfig cfg;
    cfg.tokens_per_frame = s.tpf;
    cfg.policy = c ? Policy::WorldKvC : Policy::WorldKv;
    WorldMemory mem(s.spec, cfg);
    for (int64_t i = 0; i < 20; ++i) {
      mem.prepare(i, poses_at(i, 0));
      mem.commit(i, s.chunk(i, 3), poses_at(i, 0));
    }
    bytes[c] = mem.bank().bytes(Tier::Device) + mem.bank().bytes(Tier::Host) + mem.bank().bytes(Tier::Disk);
  }
  // Anchor frame (1/3) + 25% of the other 2/3 = 1/2 of the tokens.
  EXPECT_NEAR(static_cast<double>(bytes[1]) / bytes[0], 0.5, 0.01);
}

TEST(WorldKvMemory, FillByTokensRetrievesAsManyCompressedChunksAsTheRegionHolds) {
  Synthetic s;
  MemoryConfig cfg;
  cfg.tokens_per_frame = s.tpf;
  cfg.policy = Policy::WorldKvC;
  cfg.fill_by_tokens = true;
  // A 3-frame chunk of 4 tokens per frame keeps 4 + ceil(0.25 * 8) = 6 tokens: the 9-frame
  // region's 36 tokens hold 6 compressed chunks (worldkv holds 3 whole ones).
  ASSERT_EQ(compressed_token_count(3, s.tpf, cfg.compression), 6);
  CompressionConfig pf;
  pf.per_frame = true;
  EXPECT_EQ(compressed_token_count(3, s.tpf, pf), 4 + 2 * 1);
  EXPECT_EQ(compressed_token_count(1, s.tpf, pf), 4);
  WorldMemory mem(s.spec, cfg);
  size_t bytes_at_10 = 0;
  for (int64_t i = 0; i < 30; ++i) {
    mem.prepare(i, poses_at(i, 0));
    mem.commit(i, s.chunk(i, 3), poses_at(i, 0));
    if (i == 10) bytes_at_10 = mem.window_bytes();
  }
  mem.prepare(30, poses_at(12.2, 0));
  // The six nearest banked chunks to x = 12.2, nearest first.
  std::vector<std::string> got;
  for (auto& r : mem.last_retrieval()) got.push_back(r.id);
  EXPECT_EQ(got, (std::vector<std::string>{"chunk:12", "chunk:13", "chunk:11", "chunk:14", "chunk:10", "chunk:15"}));
  EXPECT_EQ(mem.region_ids("retrieved").size(), 6u);
  EXPECT_EQ(mem.window().size(0), (3 + 3) * s.tpf + 6 * 6);  // sink + recent whole, six compressed
  EXPECT_EQ(mem.window_bytes(), bytes_at_10);  // still within the window reserved up front
}

TEST(WorldKvMemory, BankSpillsToDiskAndComesBackIntact) {
  Synthetic s;
  const std::filesystem::path scratch = wm::testing::make_temp_dir("wm_test_worldkv_spill_");
  const std::string dir = (scratch / "spill").string();  // made by the bank
  MemoryConfig cfg;
  cfg.tokens_per_frame = s.tpf;
  cfg.policy = Policy::WorldKv;
  cfg.retrieved_frames = 3;
  cfg.bank.device_budget = 0;
  cfg.bank.host_budget = 3 * 2 * 2 * (2 * 12 * 12 * 4 + 12 * 8 + 12 * 4) + 16;  // about three chunks
  cfg.bank.spill_dir = dir;
  WorldMemory mem(s.spec, cfg);
  std::vector<std::vector<LayerKv>> made;
  for (int64_t i = 0; i < 12; ++i) {
    made.push_back(s.chunk(i, 3));
    mem.prepare(i, poses_at(i, 0));
    mem.commit(i, made.back(), poses_at(i, 0));
  }
  EXPECT_GT(mem.bank().count(Tier::Disk), 0u);
  EXPECT_LE(mem.bank().bytes(Tier::Host), cfg.bank.host_budget);
  mem.prepare(12, poses_at(1, 0));  // chunk 1 is the oldest banked: on disk
  ASSERT_EQ(mem.region_ids("retrieved"), std::vector<std::string>{"chunk:1"});
  const auto& lay = mem.window().layout();
  for (int l = 0; l < 2; ++l) {
    const int64_t b = lay.segment_begin(l, "chunk:1"), n = lay.segment_len(l, "chunk:1");
    EXPECT_TRUE(mem.window().k(l).narrow(1, b, n).equal(made[1][l].k));
    EXPECT_TRUE(mem.window().v(l).narrow(1, b, n).equal(made[1][l].v));
  }
  std::filesystem::remove_all(scratch);
}

TEST(WorldKvMemory, BadConfigAndOrderAreRejected) {
  Synthetic s;
  MemoryConfig cfg;
  EXPECT_THROW(WorldMemory(s.spec, cfg), Error);  // tokens_per_frame missing
  cfg.tokens_per_frame = s.tpf;
  cfg.retrieved_frames = 4;
  EXPECT_THROW(WorldMemory(s.spec, cfg), Error);  // not whole chunks
  cfg.retrieved_frames = 9;
  WorldMemory mem(s.spec, cfg);
  EXPECT_THROW(mem.prepare(1, poses_at(0, 0)), Error);
  EXPECT_THROW(parse_policy("lru"), Error);
}

}  // namespace worldkv_test
}  // namespace wm::worldkv
