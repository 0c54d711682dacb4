#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "runtime/error.h"
#include "runtime/rope.h"
#include "runtime/window.h"
#include "test_util.h"

namespace wm {
namespace {

KvSpec small_spec(int layers = 3) {
  KvSpec s;
  s.n_layers = layers;
  s.n_kv_heads = 2;
  s.head_dim = 12;
  s.rope = RopeSpec::video3d(12);
  return s;
}

// The reference: per region, the blocks in order; per layer, the window is their concatenation.
struct Reference {
  std::vector<std::string> regions;
  std::map<std::string, std::vector<Block>> by_region;

  at::Tensor cat(int l, int which) const {  // which: 0 k, 1 v, 2 logw, 3 pos
    std::vector<at::Tensor> parts;
    for (auto& r : regions)
      for (auto& b : by_region.at(r)) {
        auto& kv = b.layers[l];
        parts.push_back(which == 0 ? kv.k : which == 1 ? kv.v : which == 2 ? kv.logw : kv.pos);
      }
    if (parts.empty()) return at::Tensor();
    return at::cat(parts, which < 2 ? 1 : 0);
  }
};

void expect_matches(const KvWindow& w, const Reference& ref, int step) {
  for (int l = 0; l < w.spec().n_layers; ++l) {
    at::Tensor k = ref.cat(l, 0);
    if (!k.defined()) {
      ASSERT_EQ(w.size(l), 0) << "step " << step;
      continue;
    }
    ASSERT_TRUE(test::bit_equal(w.k(l), k)) << "step " << step << " layer " << l;
    ASSERT_TRUE(test::bit_equal(w.v(l), ref.cat(l, 1))) << "step " << step << " layer " << l;
    ASSERT_TRUE(test::bit_equal(w.logw(l), ref.cat(l, 2))) << "step " << step << " layer " << l;
    ASSERT_TRUE(test::bit_equal(w.pos(l), ref.cat(l, 3))) << "step " << step << " layer " << l;
  }
}

// Random places, removals, drops of regions and of token ranges, each checked against the
// reference. With `storage`, the window keeps its K/V in files from the start, moves them back to
// memory at step 200 and into files again at step 300.
void random_place_drop_compact(const std::shared_ptr<const MappedStorage>& storage) {
  at::manual_seed(11);
  std::mt19937 rng(2024);
  const std::vector<std::string> regions = {"sink", "retrieved", "recent"};
  KvWindow w(small_spec(), regions, 8);
  if (storage) w.use_storage(storage);
  Reference ref{regions, {{"sink", {}}, {"retrieved", {}}, {"recent", {}}}};
  int next_id = 0;
  for (int step = 0; step < 400; ++step) {
    if (storage && (step == 200 || step == 300)) {
      w.use_storage(step == 200 ? nullptr : storage);
      ASSERT_EQ(storage->bytes() > 0, step == 300) << "step " << step;
      expect_matches(w, ref, step);
    }
    const int op = rng() % 10;
    const std::string& region = regions[rng() % regions.size()];
    auto& list = ref.by_region[region];
    if (op < 5) {
      Block b = test::random_block("b" + std::to_string(next_id++), 3, 2, 1 + rng() % 9, 12, at::kFloat, 3,
                                   rng() % 2 == 0, rng() % 1000);
      w.place(region, b);
      list.push_back(b);
    } else if (op < 7 && !list.empty()) {
      const size_t i = rng() % list.size();
      if (rng() % 2 == 0) {
        Block got = w.remove(list[i].id);
        ASSERT_TRUE(test::blocks_bit_equal(got, list[i])) << "step " << step;
      } else {
        w.drop(list[i].id);  // the same compaction, nothing copied out
      }
      list.erase(list.begin() + i);
    } else if (op == 7) {
      w.drop_region(region);
      list.clear();
    } else if (!list.empty()) {
      // Drop a token range of one layer inside the region.
      const int l = rng() % 3;
      int64_t total = 0;
      for (auto& b : list) total += b.n_tokens(l);
      if (total == 0) continue;
      const int64_t begin = rng() % total, n = 1 + rng() % std::min<int64_t>(total - begin, 5);
      w.drop_tokens(region, l, begin, n);
      int64_t off = 0;
      for (auto& b : list) {
        auto& kv = b.layers[l];
        const int64_t s0 = off, s1 = off + kv.n_tokens();
        off = s1;
        const int64_t a = std::max(s0, begin) - s0, e = std::min(s1, begin + n) - s0;
        if (e <= a) continue;
        auto keep = [&](const at::Tensor& t, int dim) {
          return at::cat({t.narrow(dim, 0, a), t.narrow(dim, e, t.size(dim) - e)}, dim);
        };
        kv.k = keep(kv.k, 1);
        kv.v = keep(kv.v, 1);
        kv.logw = keep(kv.logw, 0);
        kv.pos = keep(kv.pos, 0);
      }
    }
    expect_matches(w, ref, step);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Window, RandomPlaceDropCompactKeepsOrderAndContents) { random_place_drop_compact(nullptr); }

// The same in files (runtime/mapped_storage.h): the same contents at every step, the storage
// holding the buffers while the window uses it and nothing once the window is gone.
TEST(Window, KeepsItsKvInFilesWithTheSameContents) {
  const test::TempFolder dir("wm_window_files_");
  auto storage = std::make_shared<const MappedStorage>(dir.path.string());
  random_place_drop_compact(storage);
  EXPECT_EQ(storage->bytes(), 0u);
}

// What a block carries besides its tensors comes back out of the window with it: place, then
// extract and remove give the metadata and statistics it went in with; drops forget them.
TEST(Window, MetadataTravelsWithTheBlockThroughPlaceExtractRemove) {
  KvWindow w(small_spec(2), {"sink", "recent"});
  auto with_meta = [](const std::string& id, double priority) {
    Block b = test::random_block(id, 2, 2, 5, 12, at::kFloat, 3);
    b.meta.kind = "turn";
    b.meta.priority = priority;
    b.meta.pinned = true;
    b.meta.created = 41;
    b.meta.embedding = at::randn({4});
    b.meta.payload = std::make_shared<test::TestPayload>(std::vector<double>{priority, -1});
    b.stats.attn_ema = 0.25;
    b.stats.last_use = 40;
    b.stats.uses = 7;
    return b;
  };
  auto expect_same_meta = [](const Block& got, const Block& want) {
    EXPECT_EQ(got.meta.kind, want.meta.kind);
    EXPECT_EQ(got.meta.priority, want.meta.priority);
    EXPECT_EQ(got.meta.pinned, want.meta.pinned);
    EXPECT_EQ(got.meta.created, want.meta.created);
    EXPECT_TRUE(test::bit_equal(got.meta.embedding, want.meta.embedding));
    EXPECT_EQ(test::payload_values(got.meta), test::payload_values(want.meta));
    EXPECT_EQ(got.stats.attn_ema, want.stats.attn_ema);
    EXPECT_EQ(got.stats.last_use, want.stats.last_use);
    EXPECT_EQ(got.stats.uses, want.stats.uses);
  };
  const Block a = with_meta("a", 1.5), b = with_meta("b", 2.5), c = with_meta("c", 3.5);
  w.place("sink", a);
  w.place("recent", b, Reanchor{0, 9});  // re-anchoring moves positions, not metadata
  w.place("recent", c);
  EXPECT_EQ(w.meta("b").priority, 2.5);
  EXPECT_EQ(w.stats("c").uses, 7);
  expect_same_meta(w.extract("a"), a);
  expect_same_meta(w.extract("b"), b);
  // Segments before and after the removed one keep theirs as the window compacts.
  Block out = w.remove("b");
  expect_same_meta(out, b);
  EXPECT_TRUE(out.layers[0].pos.select(1, 0).equal(b.layers[0].pos.select(1, 0) + 9));
  EXPECT_THROW(w.meta("b"), Error);
  expect_same_meta(w.extract("a"), a);
  expect_same_meta(w.extract("c"), c);
  // Out and back in, elsewhere: the block it came back as still carries it.
  w.place("sink", out);
  expect_same_meta(w.extract("b"), b);
  // Drops forget; a segment built by append starts with empty metadata.
  w.drop("c");
  EXPECT_THROW(w.meta("c"), Error);
  w.drop_region("sink");
  EXPECT_THROW(w.meta("a"), Error);
  EXPECT_THROW(w.meta("b"), Error);
  for (int l = 0; l < 2; ++l)
    w.append("recent", "fresh", l, at::randn({2, 3, 12}), at::randn({2, 3, 12}), at::zeros({3, 3}, at::kLong));
  EXPECT_EQ(w.meta("fresh").kind, "");
  EXPECT_EQ(w.meta("fresh").payload, nullptr);
  w.place("recent", a);
  w.clear();
  EXPECT_THROW(w.meta("a"), Error);
  EXPECT_THROW(w.meta("fresh"), Error);
}

TEST(Window, AppendPerLayerBuildsOneSegment) {
  KvWindow w(small_spec(2), {"recent"});
  at::Tensor pos = at::zeros({4, 3}, at::kLong);
  for (int l = 0; l < 2; ++l) w.append("recent", "c0", l, at::randn({2, 4, 12}), at::randn({2, 4, 12}), pos);
  EXPECT_EQ(w.layout().segments(0).size(), 1u);
  EXPECT_EQ(w.size(0), 4);
  EXPECT_EQ(w.size(1), 4);
  EXPECT_THROW(w.append("recent", "c1", 0, at::randn({3, 4, 12}), at::randn({3, 4, 12}), pos), Error);
  EXPECT_THROW(w.append("nope", "c1", 0, at::randn({2, 4, 12}), at::randn({2, 4, 12}), pos), Error);
}

TEST(Window, ReanchoredPlacementEqualsRopeAtNewPositions) {
  KvSpec spec = small_spec(2);
  KvWindow w(spec, {"retrieved", "recent"});
  const int n = 6;
  at::Tensor raw = at::randn({2, n, 12});
  at::Tensor pos = at::randint(0, 500, {n, 3}, at::kLong);
  Block b;
  b.id = "chunk:3";
  for (int l = 0; l < 2; ++l) b.layers.push_back({apply_rope(raw, pos, spec.rope), raw * 2, pos, at::zeros({n})});
  w.place("retrieved", b, Reanchor{0, 1234});
  at::Tensor newpos = pos.clone();
  newpos.select(1, 0).add_(1234);
  at::Tensor direct = apply_rope(raw, newpos, spec.rope);
  for (int l = 0; l < 2; ++l) {
    EXPECT_LE((w.k(l) - direct).abs().max().item<float>(), 1e-5);
    EXPECT_TRUE(w.v(l).equal(raw * 2));  // V untouched
    EXPECT_TRUE(w.pos(l).equal(newpos));
  }
}

// keep_tokens is a gather of the kept tokens over K, V, log-weights and positions of one layer,
// leaving the other layers alone; the segments shrink by what they lost (one may be emptied in
// that layer and stays, so that later appends and drops still find it).
TEST(Window, KeepTokensGathersOneLayerAndShrinksItsSegments) {
  KvSpec spec = small_spec(2);
  KvWindow w(spec, {"sink", "recent"});
  std::vector<Block> blocks;
  for (int i = 0; i < 3; ++i) {
    Block b = test::random_block("b" + std::to_string(i), 2, 2, 5 + i, 12, at::kFloat, 3);
    for (auto& l : b.layers) l.logw = at::randn({l.k.size(1)});
    w.place(i == 0 ? "sink" : "recent", b);
    blocks.push_back(b);
  }
  const int64_t n = w.size(1);  // 5 + 6 + 7
  ASSERT_EQ(n, 18);
  const at::Tensor k0 = w.k(0).clone(), k1 = w.k(1).clone(), v1 = w.v(1).clone(), lw1 = w.logw(1).clone(),
                   p1 = w.pos(1).clone();
  const std::vector<int64_t> keep = {0, 3, 11, 12, 17};  // b0: 2 tokens, b1: none, b2: 3
  w.keep_tokens(1, keep);
  const at::Tensor idx = at::tensor(keep, at::kLong);
  EXPECT_TRUE(test::bit_equal(w.k(1), k1.index_select(1, idx)));
  EXPECT_TRUE(test::bit_equal(w.v(1), v1.index_select(1, idx)));
  EXPECT_TRUE(test::bit_equal(w.logw(1), lw1.index_select(0, idx)));
  EXPECT_TRUE(test::bit_equal(w.pos(1), p1.index_select(0, idx)));
  EXPECT_TRUE(test::bit_equal(w.k(0), k0));  // the other layer untouched
  EXPECT_EQ(w.layout().segment_len(1, "b0"), 2);
  EXPECT_EQ(w.layout().segment_len(1, "b1"), 0);
  EXPECT_EQ(w.layout().segment_len(1, "b2"), 3);
  EXPECT_EQ(w.layout().segment_len(0, "b1"), 6);
  // The emptied segment is still there: dropping it compacts layer 0 and leaves layer 1 as is.
  w.drop("b1");
  EXPECT_EQ(w.size(0), 12);
  EXPECT_TRUE(test::bit_equal(w.k(1), k1.index_select(1, idx)));
  EXPECT_THROW(w.keep_tokens(1, {2, 1}), Error);  // out of order
  EXPECT_THROW(w.keep_tokens(1, {0, 5}), Error);  // out of range
  EXPECT_THROW(w.keep_tokens(2, {0}), Error);     // no such layer
}

// write_tokens overwrites K/V/log-weights of chosen tokens in place; positions, the other
// tokens and the other layers stay.
TEST(Window, WriteTokensOverwritesInPlace) {
  KvSpec spec = small_spec(2);
  KvWindow w(spec, {"recent"});
  w.place("recent", test::random_block("b", 2, 2, 8, 12, at::kFloat, 3));
  const at::Tensor k0 = w.k(0).clone(), k1 = w.k(1).clone(), v1 = w.v(1).clone(), lw1 = w.logw(1).clone(),
                   p1 = w.pos(1).clone();
  const std::vector<int64_t> idx = {6, 1};
  const at::Tensor k = at::randn({2, 2, 12}), v = at::randn({2, 2, 12}), lw = at::tensor({0.5f, -1.0f});
  w.write_tokens(1, idx, k, v, lw);
  for (int j = 0; j < 2; ++j) {
    EXPECT_TRUE(test::bit_equal(w.k(1).select(1, idx[j]), k.select(1, j)));
    EXPECT_TRUE(test::bit_equal(w.v(1).select(1, idx[j]), v.select(1, j)));
    EXPECT_EQ(w.logw(1)[idx[j]].item<float>(), lw[j].item<float>());
  }
  for (int64_t t : {0, 2, 3, 4, 5, 7}) {
    EXPECT_TRUE(test::bit_equal(w.k(1).select(1, t), k1.select(1, t))) << t;
    EXPECT_TRUE(test::bit_equal(w.v(1).select(1, t), v1.select(1, t))) << t;
    EXPECT_EQ(w.logw(1)[t].item<float>(), lw1[t].item<float>()) << t;
  }
  EXPECT_TRUE(test::bit_equal(w.pos(1), p1));
  EXPECT_TRUE(test::bit_equal(w.k(0), k0));
  EXPECT_THROW(w.write_tokens(1, {8}, k.narrow(1, 0, 1), v.narrow(1, 0, 1), lw.narrow(0, 0, 1)), Error);  // range
  EXPECT_THROW(w.write_tokens(1, {2, 2}, k, v, lw), Error);                                              // twice
  EXPECT_THROW(w.write_tokens(1, {2, 3}, k.narrow(2, 0, 6), v, lw), Error);                              // shape
  EXPECT_THROW(w.write_tokens(1, {2, 3}, k, v, lw.narrow(0, 0, 1)), Error);                              // logw
}

// shift_tokens re-anchors a span: its keys equal RoPE of the raw keys at the shifted positions,
// V and log-weights and the tokens outside the span untouched.
TEST(Window, ShiftTokensEqualsRopeAtShiftedPositions) {
  KvSpec spec = small_spec(1);
  KvWindow w(spec, {"recent"});
  const int n = 9;
  at::Tensor raw = at::randn({2, n, 12});
  at::Tensor pos = at::randint(0, 500, {n, 3}, at::kLong);
  w.append("recent", "t", 0, apply_rope(raw, pos, spec.rope), raw * 3, pos, at::randn({n}));
  const at::Tensor k = w.k(0).clone(), lw = w.logw(0).clone();
  w.shift_tokens(0, 4, 5, Reanchor{1, -321});
  at::Tensor newpos = pos.clone();
  newpos.narrow(0, 4, 5).select(1, 1).add_(-321);
  EXPECT_LE((w.k(0) - apply_rope(raw, newpos, spec.rope)).abs().max().item<float>(), 1e-5);
  EXPECT_TRUE(test::bit_equal(w.k(0).narrow(1, 0, 4), k.narrow(1, 0, 4)));
  EXPECT_TRUE(w.pos(0).equal(newpos));
  EXPECT_TRUE(w.v(0).equal(raw * 3));
  EXPECT_TRUE(test::bit_equal(w.logw(0), lw));
  EXPECT_THROW(w.shift_tokens(0, 5, 5, Reanchor{0, 1}), Error);  // leaves the layer
  EXPECT_THROW(w.shift_tokens(0, 0, 1, Reanchor{3, 1}), Error);  // no such axis
}

TEST(Window, StagedViewEqualsConcatenation) {
  KvWindow w(small_spec(1), {"recent"});
  Block b = test::random_block("a", 1, 2, 5, 12, at::kFloat, 3);
  w.place("recent", b);
  at::Tensor kc = at::randn({2, 3, 12}), vc = at::randn({2, 3, 12});
  auto s = w.stage(0, kc, vc);
  EXPECT_EQ(s.n_window, 5);
  EXPECT_TRUE(s.k.equal(at::cat({b.layers[0].k, kc}, 1)));
  EXPECT_TRUE(s.v.equal(at::cat({b.layers[0].v, vc}, 1)));
  EXPECT_TRUE(s.logw.equal(at::cat({b.layers[0].logw, at::zeros({3})})));
  EXPECT_EQ(w.size(0), 5);  // staging does not change the window
}

// Committing staged tokens (stage() or stage_raw() then commit_staged) leaves the window as
// append() of the same tokens does: at the layer's end, and before a later region's tokens.
TEST(Window, CommitStagedEqualsAppend) {
  for (const bool later_region : {false, true}) {
    KvWindow a(small_spec(1), {"blocks", "recent"}), b(small_spec(1), {"blocks", "recent"});
    Block blk = test::random_block("x", 1, 2, 5, 12, at::kFloat, 3);
    a.place(later_region ? "recent" : "blocks", blk);
    b.place(later_region ? "recent" : "blocks", blk);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor kc = at::randn({2, 2, 12}), vc = at::randn({2, 2, 12});
      const at::Tensor pos = at::full({2, 3}, 40 + step, at::kLong);
      a.append("blocks", "new", 0, kc, vc, pos);
      if (step == 1) {
        // The raw staging: the caller writes the rows.
        auto r = b.stage_raw(0, 2);
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t j = 0; j < 2; ++j) {
            std::memcpy(static_cast<float*>(r.k) + h * r.head_stride + (r.n + j) * 12,
                        kc[h][j].contiguous().data_ptr<float>(), 12 * sizeof(float));
            std::memcpy(static_cast<float*>(r.v) + h * r.head_stride + (r.n + j) * 12,
                        vc[h][j].contiguous().data_ptr<float>(), 12 * sizeof(float));
          }
      } else {
        b.stage(0, kc, vc);
      }
      b.commit_staged("blocks", "new", 0, 2, pos);
      ASSERT_TRUE(test::bit_equal(a.k(0), b.k(0))) << later_region << " step " << step;
      ASSERT_TRUE(test::bit_equal(a.v(0), b.v(0))) << later_region << " step " << step;
      ASSERT_TRUE(test::bit_equal(a.logw(0), b.logw(0))) << later_region << " step " << step;
      ASSERT_TRUE(a.pos(0).equal(b.pos(0))) << later_region << " step " << step;
    }
  }
}

TEST(Window, GrowthIsStaggeredAcrossLayers) {
  const int L = 8;
  KvWindow w(small_spec(L), {"recent"}, 16);
  // Append one chunk per step to every layer; record which layers reallocate at each step.
  std::vector<int64_t> before(L, 0);
  int steps_with_realloc = 0, max_layers_in_one_step = 0;
  for (int step = 0; step < 60; ++step) {
    const std::string id = "c" + std::to_string(step);
    for (int l = 0; l < L; ++l)
      w.append("recent", id, l, at::randn({2, 7, 12}), at::randn({2, 7, 12}), at::zeros({7, 3}, at::kLong));
    int n = 0;
    for (int l = 0; l < L; ++l) {
      n += w.reallocations(l) != before[l];
      before[l] = w.reallocations(l);
    }
    steps_with_realloc += n > 0;
    max_layers_in_one_step = std::max(max_layers_in_one_step, n);
  }
  EXPECT_GT(steps_with_realloc, 0);
  EXPECT_LT(max_layers_in_one_step, L) << "every layer reallocated on the same step";
  for (int l = 0; l < L; ++l) EXPECT_GE(w.capacity(l), w.size(l));
}

TEST(Window, ReserveMeansNoReallocation) {
  KvWindow w(small_spec(2), {"sink", "recent"});
  w.reserve(100);
  for (int i = 0; i < 10; ++i) w.place("recent", test::random_block("c" + std::to_string(i), 2, 2, 10, 12, at::kFloat, 3));
  EXPECT_EQ(w.reallocations(0), 1);  // the reserve itself
  EXPECT_EQ(w.reallocations(1), 1);
  const size_t bytes = w.bytes_allocated();
  w.drop_region("recent");
  for (int i = 0; i < 10; ++i) w.place("recent", test::random_block("d" + std::to_string(i), 2, 2, 10, 12, at::kFloat, 3));
  EXPECT_EQ(w.bytes_allocated(), bytes);
}

TEST(WindowLayout, RejectsBadRegionsAndRanges) {
  EXPECT_THROW(WindowLayout({"a", "a"}, 1), Error);
  EXPECT_THROW(WindowLayout({}, 1), Error);
  WindowLayout lay({"a", "b"}, 2);
  lay.add_segment(1, "x");
  lay.grow(0, "x", 4);
  lay.grow(1, "x", 2);
  EXPECT_EQ(lay.size(0), 4);
  EXPECT_EQ(lay.size(1), 2);
  EXPECT_THROW(lay.add_segment(0, "x"), Error);
  EXPECT_THROW(lay.drop_tokens(1, 1, 1, 2), Error);
  lay.drop_tokens(0, 1, 1, 2);
  EXPECT_EQ(lay.size(0), 2);
  EXPECT_THROW(lay.region("c"), Error);
}

}  // namespace
}  // namespace wm
