#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/rope.h"
#include "test_util.h"

namespace wm {
namespace {

KvSpec text_spec() {
  KvSpec s;
  s.n_layers = 2;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.rope = RopeSpec::text1d(8);
  return s;
}

std::vector<std::string> ids_in(const KvMemory& m, const std::string& region) {
  std::vector<std::string> out;
  const auto& lay = m.window().layout();
  for (auto& s : lay.segments(lay.region(region))) out.push_back(s.id);
  return out;
}

Block block_with_meta(const std::string& id, int n, int64_t base, double tag) {
  Block b = test::random_block(id, 2, 2, n, 8, at::kFloat, 1, false, base);
  b.meta.kind = "file";
  b.meta.created = base;
  b.meta.payload = std::make_shared<test::TestPayload>(std::vector<double>{tag});
  return b;
}

TEST(Memory, PlansApplyInOrderAndCarryMetadata) {
  KvMemory mem(text_spec(), {"system", "blocks", "recent"}, StoreConfig{});
  const Block a = block_with_meta("a", 4, 0, 1), b = block_with_meta("b", 6, 4, 2), c = block_with_meta("c", 3, 10, 3);
  mem.apply(MemoryPlan().insert("system", a).insert("recent", b).insert("recent", c));
  EXPECT_EQ(ids_in(mem, "system"), std::vector<std::string>{"a"});
  EXPECT_EQ(ids_in(mem, "recent"), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(mem.window().size(0), 13);

  // b leaves into the bank through a transform (it keeps two tokens); c is dropped.
  int64_t seen_created = -1;
  auto keep_two = [&](const Block& in) {
    seen_created = in.meta.created;  // the transform sees the block with its metadata
    Block out = in;
    for (auto& l : out.layers) l = {l.k.narrow(1, 0, 2), l.v.narrow(1, 0, 2), l.pos.narrow(0, 0, 2), l.logw.narrow(0, 0, 2)};
    return out;
  };
  mem.apply(MemoryPlan().bank("b", keep_two).drop("c"));
  EXPECT_EQ(seen_created, 4);
  EXPECT_EQ(ids_in(mem, "recent"), std::vector<std::string>{});
  ASSERT_TRUE(mem.bank().contains("b"));
  EXPECT_FALSE(mem.bank().contains("c"));
  EXPECT_EQ(mem.bank().meta("b").kind, "file");
  EXPECT_EQ(test::payload_values(mem.bank().meta("b")), std::vector<double>{2});

  // Back into the blocks region, re-anchored by +100 on t; the bank keeps its copy.
  mem.apply(MemoryPlan().fetch("b", "blocks", Reanchor{0, 100}));
  EXPECT_EQ(ids_in(mem, "blocks"), std::vector<std::string>{"b"});
  EXPECT_TRUE(mem.bank().contains("b"));
  EXPECT_EQ(test::payload_values(mem.window().meta("b")), std::vector<double>{2});
  const auto& lay = mem.window().layout();
  for (int l = 0; l < 2; ++l) {
    const int64_t s = lay.segment_begin(l, "b");
    EXPECT_TRUE(mem.window().pos(l).narrow(0, s, 2).equal(b.layers[l].pos.narrow(0, 0, 2) + 100));
    EXPECT_LE((mem.window().k(l).narrow(1, s, 2) -
               reanchor(b.layers[l].k.narrow(1, 0, 2), mem.spec().rope, 0, 100)).abs().max().item<float>(),
              1e-6);
    EXPECT_TRUE(mem.window().v(l).narrow(1, s, 2).equal(b.layers[l].v.narrow(1, 0, 2)));
  }
}

TEST(Memory, AFailingOpIsNamedAndEarlierOpsStay) {
  KvMemory mem(text_spec(), {"blocks", "recent"}, StoreConfig{});
  try {
    mem.apply(MemoryPlan().insert("recent", block_with_meta("a", 3, 0, 1)).fetch("absent", "blocks"));
    ADD_FAILURE() << "fetching an absent block succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fetch 'absent'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ids_in(mem, "recent"), std::vector<std::string>{"a"});
  EXPECT_THROW(mem.apply(MemoryPlan().drop("absent")), Error);
  EXPECT_THROW(mem.apply(MemoryPlan().insert("nowhere", block_with_meta("b", 3, 3, 2))), Error);
  EXPECT_THROW(mem.apply(MemoryPlan().insert("recent", block_with_meta("a", 3, 3, 2))), Error);  // already in
}

// A policy of another shape than the video path's, written against the interface alone:
// "recent" keeps the `cap` newest blocks and banks the rest (reversible eviction); before each
// step the banked block whose embedding is closest to the next one's comes back into "recalled"
// (recovery), re-anchored to sit just before recent.
class RecallPolicy final : public MemoryPolicy {
 public:
  RecallPolicy(int cap, int64_t tokens_per_block) : cap_(cap), n_(tokens_per_block) {}
  std::vector<std::string> regions() const override { return {"recalled", "recent"}; }
  MemoryPlan prepare(const KvMemory& memory, const BlockMeta& next) override {
    MemoryPlan plan;
    const auto& lay = memory.window().layout();
    for (auto& s : lay.segments(lay.region("recalled"))) plan.drop(s.id);
    std::string best;
    double best_d = 0;
    for (auto& id : memory.bank().ids()) {
      const double d = (memory.bank().meta(id).embedding - next.embedding).abs().sum().item<double>();
      if (best.empty() || d < best_d) best = id, best_d = d;
    }
    if (best.empty()) return plan;
    const auto& recent = lay.segments(lay.region("recent"));
    const int64_t first_recent = recent.empty() ? next.created : memory.window().meta(recent.front().id).created;
    plan.fetch(best, "recalled", Reanchor{0, first_recent - n_ - memory.bank().meta(best).created});
    return plan;
  }
  MemoryPlan admit(const KvMemory& memory, Block block) override {
    const auto& lay = memory.window().layout();
    std::vector<std::string> recent;
    for (auto& s : lay.segments(lay.region("recent"))) recent.push_back(s.id);
    MemoryPlan plan;
    plan.insert("recent", std::move(block));
    for (size_t i = 0; recent.size() + 1 - i > static_cast<size_t>(cap_); ++i) plan.bank(recent[i]);
    return plan;
  }

 private:
  int cap_;
  int64_t n_;
};

TEST(Memory, AnotherPathsPolicyEvictsAndRecoversBitExact) {
  KvSpec spec = text_spec();
  RecallPolicy policy(2, 5);
  KvMemory mem(spec, policy.regions(), StoreConfig{});
  std::vector<Block> made;
  int64_t t = 0;
  for (int i = 0; i < 6; ++i) {
    Block b = block_with_meta("turn:" + std::to_string(i), 5, t, i);
    b.meta.embedding = at::full({3}, static_cast<double>(i));
    BlockMeta next = b.meta;
    mem.apply(policy.prepare(mem, next));
    made.push_back(b);
    mem.apply(policy.admit(mem, std::move(b)));
    t += 5;
    EXPECT_LE(ids_in(mem, "recent").size(), 2u);
  }
  EXPECT_EQ(ids_in(mem, "recent"), (std::vector<std::string>{"turn:4", "turn:5"}));
  EXPECT_EQ(mem.bank().size(), 4u);
  // The next turn looks like turn 1: it comes back, bit-exact in V, K rotated to just before recent.
  BlockMeta next;
  next.created = t;
  next.embedding = at::full({3}, 1.2);
  mem.apply(policy.prepare(mem, next));
  ASSERT_EQ(ids_in(mem, "recalled"), std::vector<std::string>{"turn:1"});
  EXPECT_EQ(test::payload_values(mem.window().meta("turn:1")), std::vector<double>{1});
  const auto& lay = mem.window().layout();
  for (int l = 0; l < spec.n_layers; ++l) {
    const int64_t s = lay.segment_begin(l, "turn:1");
    EXPECT_TRUE(test::bit_equal(mem.window().v(l).narrow(1, s, 5), made[1].layers[l].v));
    EXPECT_TRUE(mem.window().pos(l).narrow(0, s, 5).equal(made[1].layers[l].pos + (20 - 5 - 5)));
    EXPECT_LE((mem.window().k(l).narrow(1, s, 5) - reanchor(made[1].layers[l].k, spec.rope, 0, 10)).abs().max().item<float>(),
              1e-5);
  }
}

}  // namespace
}  // namespace wm
