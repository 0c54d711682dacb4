// EVOKE's primitive on the text path: a block of context saved to the bank (spilled to disk)
// and spliced back elsewhere, re-anchored by one RoPE rotation, gives the logits of a cache
// where the block was computed at its new place; the banked block comes back bit for bit.
#include <gtest/gtest.h>

#include <filesystem>

#include "llm_test_util.h"
#include "runtime/memory.h"
#include "tests/temp_dir.h"

namespace wm::llm {
namespace {

at::Tensor ids(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

at::Tensor positions(int64_t from, int64_t n) { return at::arange(from, from + n, at::kLong); }

StepResult run(LlmModelImpl& m, KvWindow& w, const std::vector<int64_t>& tokens, int64_t from,
               const std::string& region, const std::string& segment, bool all_logits = false) {
  StepOptions so;
  so.region = region;
  so.segment = segment;
  so.all_logits = all_logits;
  return m.step(ids(tokens), positions(from, static_cast<int64_t>(tokens.size())), w, so);
}

TEST(BankSplice, ASplicedBlockGivesTheLogitsOfOneComputedInPlace) {
  LlmModel model = test::random_model(61, 11);
  const std::vector<std::string> regions = {"system", "blocks", "recent"};
  const std::vector<int64_t> prefix = {3, 14, 15, 9, 2, 6, 5, 35, 8, 9};  // 10 tokens
  std::vector<int64_t> block;
  for (int i = 0; i < 24; ++i) block.push_back((7 * i + 5) % 61);
  const std::vector<int64_t> tail = {42, 17, 1, 60, 33};
  const int64_t P = static_cast<int64_t>(prefix.size()), B = static_cast<int64_t>(block.size());

  // The block computed where it was first seen: alone, at positions [0, B); banked with a bank
  // that holds nothing in memory, so it goes to disk.
  const std::filesystem::path folder = wm::testing::make_temp_dir("wm_bank_splice_test_");
  const std::filesystem::path dir = folder / "bank";  // made by the bank
  StoreConfig bank;
  bank.device_budget = 0;
  bank.host_budget = 0;
  bank.spill_dir = dir.string();
  const KvSpec spec = model->kv_spec(at::kCPU, at::kFloat);
  KvMemory mem(spec, regions, bank);
  run(*model, mem.window(), block, 0, "blocks", "file:doc#0");
  const Block original = mem.window().extract("file:doc#0");
  mem.apply(MemoryPlan().bank("file:doc#0"));
  EXPECT_EQ(mem.window().size(0), 0);
  ASSERT_EQ(mem.bank().tier_of("file:doc#0"), Tier::Disk);
  // Back from disk bit for bit (fetched as it was, then dropped again).
  mem.apply(MemoryPlan().fetch("file:doc#0", "blocks"));
  const Block back = mem.window().extract("file:doc#0");
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_TRUE(at::equal(back.layers[l].k, original.layers[l].k)) << l;
    EXPECT_TRUE(at::equal(back.layers[l].v, original.layers[l].v)) << l;
    EXPECT_TRUE(at::equal(back.layers[l].pos, original.layers[l].pos)) << l;
  }
  mem.apply(MemoryPlan().drop("file:doc#0"));
  ASSERT_EQ(mem.window().size(0), 0);
  // Now a prefix, the block spliced after it (moved by P), the tail.
  run(*model, mem.window(), prefix, 0, "system", "system");
  mem.apply(MemoryPlan().fetch("file:doc#0", "blocks", Reanchor{0, P}));
  const at::Tensor spliced = run(*model, mem.window(), tail, P + B, "recent", "recent", true).logits;

  // The reference: the block computed alone at [P, P + B), placed after the same prefix as is.
  KvWindow scratch(spec, regions);
  run(*model, scratch, block, P, "blocks", "file:doc#0");
  const Block in_place = scratch.extract("file:doc#0");
  KvWindow ref(spec, regions);
  run(*model, ref, prefix, 0, "system", "system");
  ref.place("blocks", in_place);
  const at::Tensor want = run(*model, ref, tail, P + B, "recent", "recent", true).logits;

  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_TRUE(at::equal(mem.window().pos(l), ref.pos(l))) << l;
    // V never moves with a re-anchor.
    EXPECT_TRUE(at::equal(mem.window().v(l).narrow(1, P, B), original.layers[l].v)) << l;
  }
  const double diff = (spliced - want).abs().max().item<double>();
  std::printf("  spliced vs computed in place: max |logit difference| %.2e over %lld tail tokens\n", diff,
              static_cast<long long>(tail.size()));
  EXPECT_LE(diff, 1e-4);
  // And re-anchoring matters: the block spliced without the move gives other logits.
  KvWindow unmoved(spec, regions);
  run(*model, unmoved, prefix, 0, "system", "system");
  unmoved.place("blocks", original);
  const at::Tensor wrong = run(*model, unmoved, tail, P + B, "recent", "recent", true).logits;
  EXPECT_GT((wrong - want).abs().max().item<double>(), 1e-3);
  std::filesystem::remove_all(folder);
}

}  // namespace
}  // namespace wm::llm
