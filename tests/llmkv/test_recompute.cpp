// The chunk KV cache (llmkv/chunk_cache.h) and the recompute policies over it
// (llmkv/recompute/): placement, exactness at full recompute, multi-hop selection, KEEP's
// static-dynamic memory, damaged spill files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "llm_test_util.h"
#include "llmkv/chunk_cache.h"
#include "llmkv/recompute/blend.h"
#include "llmkv/recompute/keep_memory.h"
#include "llmkv/recompute/multi_hop.h"
#include "llmkv/recompute/recompute_policy.h"
#include "runtime/error.h"
#include "runtime/rope.h"
#include "tests/runtime/test_util.h"
#include "tests/temp_dir.h"

namespace wm::llm {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace recompute_test {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 61;

LlmModel model_of(int layers, uint64_t seed = 7) {
  LlmConfig c = test::small_config(kVocab);
  c.num_hidden_layers = layers;
  c.validate();
  LlmModel m(c);
  m->init_weights(seed);
  m->eval();
  return m;
}

std::vector<int64_t> random_ids(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor t = at::randint(1, kVocab, {n}, at::kLong);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
}

// rules (8 tokens), memory lines m0..m{n_lines-1} of 5..10 tokens (cycling), a fresh query of 6.
std::vector<PromptSegment> make_prompt(uint64_t seed = 1, int n_lines = 6) {
  std::vector<PromptSegment> p;
  p.push_back({"rules", random_ids(8, seed * 100), true});
  for (int i = 0; i < n_lines; ++i)
    p.push_back({"m" + std::to_string(i), random_ids(5 + i % 6, seed * 100 + 1 + i), true});
  p.push_back({"query", random_ids(6, seed * 100 + 50), false});
  return p;
}

std::vector<int64_t> all_ids(const std::vector<PromptSegment>& p) {
  std::vector<int64_t> ids;
  for (const auto& s : p) ids.insert(ids.end(), s.ids.begin(), s.ids.end());
  return ids;
}

KvWindow window_for(LlmModelImpl& m) { return KvWindow(m.kv_spec(m.device(), m.dtype()), {"recent"}); }

// The whole prompt prefilled in one step: K/V in `w`, the last token's logits.
at::Tensor full_prefill(LlmModelImpl& m, const std::vector<PromptSegment>& p, KvWindow& w) {
  const std::vector<int64_t> ids = all_ids(p);
  const int64_t n = static_cast<int64_t>(ids.size());
  StepResult r = m.step(at::tensor(ids, at::kLong), at::arange(n, at::kLong), w, {});
  return r.logits.select(0, 0);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

ChunkCacheConfig cache_config(const std::string& spill_dir = "", size_t host_budget = SIZE_MAX) {
  ChunkCacheConfig cc;
  cc.store.device_budget = 0;
  cc.store.host_budget = host_budget;
  cc.store.spill_dir = spill_dir;
  return cc;
}

RecomputeConfig policy_config(const std::string& name, double ratio = 0.15) {
  RecomputeConfig rc;
  rc.policy = name;
  rc.ratio = ratio;
  return rc;
}

// keep at ratio 0.3 with one check layer and head_tokens.
RecomputeConfig keep_config(int check_layer, int head_tokens) {
  RecomputeConfig rc = policy_config("keep", 0.3);
  rc.check_layers = {check_layer};
  rc.head_tokens = head_tokens;
  return rc;
}

std::string fresh_dir(const std::string& name) {
  return wm::testing::make_temp_dir(name + "_").string();
}

TEST(ChunkCache, KeysFollowTokensModelAndPrefix) {
  LlmModel a = model_of(2, 1), b = model_of(2, 2);
  ChunkCache ca(a, cache_config()), cb(b, cache_config());
  const auto x = random_ids(9, 3), y = random_ids(9, 4);
  EXPECT_EQ(ca.chunk_key(x), ca.chunk_key(x));
  EXPECT_NE(ca.chunk_key(x), ca.chunk_key(y));
  EXPECT_NE(ca.chunk_key(x), cb.chunk_key(x));  // other weights, other keys
  EXPECT_NE(ca.model_key(), cb.model_key());
  // Chained: changing segment 1 changes its prefix key and every later one, never an earlier one.
  const auto k1 = ca.prefix_keys({x, y, x}), k2 = ca.prefix_keys({x, x, x});
  EXPECT_EQ(k1[0], k2[0]);
  EXPECT_NE(k1[1], k2[1]);
  EXPECT_NE(k1[2], k2[2]);
  EXPECT_NE(k1[0], ca.chunk_key(x));  // prefix and chunk entries never collide
}

TEST(ChunkCache, AReanchoredBlockHasTheKeysOfTheSegmentPrefilledAtItsNewPosition) {
  LlmModel m = model_of(3);
  ChunkCache cache(m, cache_config());
  const auto ids = random_ids(11, 5);
  const ChunkKv at0 = cache.prefill(ids, 0);
  for (int64_t offset : {1, 23, 517}) {
    const ChunkKv there = cache.prefill(ids, offset);  // nothing before it, at its new positions
    double worst = 0;
    for (int l = 0; l < 3; ++l) {
      const at::Tensor moved = reanchor(at0.layers[l].k, m->rope(), 0, offset);
      worst = std::max(worst, max_diff(moved, there.layers[l].k));
      worst = std::max(worst, max_diff(at0.layers[l].v, there.layers[l].v));  // V does not move
    }
    EXPECT_LT(worst, 1e-5) << "offset " << offset;
  }
}

TEST(ChunkCache, FullReusePlacesEveryEntryReanchoredAtItsOffset) {
  LlmModel m = model_of(3);
  ChunkCache cache(m, cache_config());
  auto policy = make_recompute_policy(policy_config("full_reuse"));
  const auto prompt = make_prompt();
  KvWindow w = window_for(*m);
  prefill_with_reuse(cache, *policy, prompt, w);
  const std::vector<int64_t> off = segment_offsets(prompt);
  double worst = 0;
  for (size_t s = 0; s + 1 < prompt.size(); ++s) {
    const ChunkKv alone = cache.prefill(prompt[s].ids, off[s]);
    const int64_t n = static_cast<int64_t>(prompt[s].ids.size());
    for (int l = 0; l < 3; ++l) {
      worst = std::max(worst, max_diff(w.k(l).narrow(1, off[s], n), alone.layers[l].k));
      worst = std::max(worst, max_diff(w.v(l).narrow(1, off[s], n), alone.layers[l].v));
      EXPECT_TRUE(w.pos(l).narrow(0, off[s], n).equal(alone.layers[l].pos));
    }
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(Recompute, RecomputingEveryTokenEqualsFullRecompute) {
  LlmModel m = model_of(4);
  const auto prompt = make_prompt();
  KvWindow ref_w = window_for(*m);
  const at::Tensor ref = full_prefill(*m, prompt, ref_w);
  for (const std::string name : {"full_recompute", "cacheblend", "keep", "keep_no_grouping", "keep_next_layer"}) {
    ChunkCache cache(m, cache_config());
    auto policy = make_recompute_policy(policy_config(name, 1.0));
    for (int round = 0; round < 2; ++round) {  // the second round from cached entries
      KvWindow w = window_for(*m);
      const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
      EXPECT_LT(max_diff(r.logits, ref), 1e-5) << name << " round " << round;
      double worst = 0;
      for (int l = 0; l < 4; ++l) {
        worst = std::max(worst, max_diff(w.k(l), ref_w.k(l)));
        worst = std::max(worst, max_diff(w.v(l), ref_w.v(l)));
      }
      EXPECT_LT(worst, 1e-5) << name << " round " << round;
      // The rules, at position 0, are exact from their entry; every other memory token is recomputed.
      EXPECT_NEAR(r.stats.recomputed_fraction(), name == "full_recompute" ? 1.0 : 45.0 / 53.0, 1e-12) << name;
      if (name != "full_recompute") EXPECT_EQ(r.stats.misses, round == 0 ? 7 : 0) << name;
    }
  }
  // Without recompute the attention between segments is lost: the same test fails.
  ChunkCache cache(m, cache_config());
  auto reuse = make_recompute_policy(policy_config("full_reuse"));
  KvWindow w = window_for(*m);
  const ReuseResult r = prefill_with_reuse(cache, *reuse, prompt, w);
  EXPECT_GT(max_diff(r.logits, ref), 1e-3);
  EXPECT_EQ(r.stats.recomputed_fraction(), 0.0);
}

// Two layers, keep at layer 0: layer 1's K/V are exact for the selected lines and for the first
// head_tokens tokens of every other line (and the rules at position 0, and the query); the rest
// of every other line has the cached K/V, re-anchored.
void expect_selected_lines_exact_and_the_others_cached(const std::vector<PromptSegment>& prompt, int head_tokens) {
  LlmModel m = model_of(2);
  KvWindow ref_w = window_for(*m);
  full_prefill(*m, prompt, ref_w);
  ChunkCache cache(m, cache_config());
  auto policy = make_recompute_policy(keep_config(0, head_tokens));
  KvWindow w = window_for(*m);
  const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
  const std::vector<int64_t> off = segment_offsets(prompt);
  int exact_lines = 0, stale_lines = 0;
  int64_t exact_tokens = 0;
  for (size_t s = 1; s + 1 < prompt.size(); ++s) {
    const int64_t n = off[s + 1] - off[s], h = std::min<int64_t>(head_tokens, n), b = off[s] + h;
    ASSERT_LT(h, n) << "every line must be longer than its head";
    if (h > 0) {
      EXPECT_LT(max_diff(w.k(1).narrow(1, off[s], h), ref_w.k(1).narrow(1, off[s], h)), 1e-5) << "head, line " << s;
      EXPECT_LT(max_diff(w.v(1).narrow(1, off[s], h), ref_w.v(1).narrow(1, off[s], h)), 1e-5) << "head, line " << s;
    }
    const double to_full = max_diff(w.k(1).narrow(1, b, n - h), ref_w.k(1).narrow(1, b, n - h));
    const at::Tensor cached = reanchor(cache.layer(cache.chunk_key(prompt[s].ids), 1).k, m->rope(), 0, off[s]);
    const double to_cached = max_diff(w.k(1).narrow(1, b, n - h), cached.narrow(1, h, n - h));
    EXPECT_TRUE(to_full < 1e-5 || to_cached < 1e-5) << "line " << s << ": " << to_full << " " << to_cached;
    exact_lines += to_full < 1e-5;
    exact_tokens += to_full < 1e-5 ? n : h;
    stale_lines += to_cached < 1e-5 && to_full >= 1e-5;
    const bool v_exact = max_diff(w.v(1).narrow(1, b, n - h), ref_w.v(1).narrow(1, b, n - h)) < 1e-5;
    EXPECT_EQ(v_exact, to_full < 1e-5) << "V follows K, line " << s;
  }
  EXPECT_GT(exact_lines, 0);
  EXPECT_GT(stale_lines, 0);
  EXPECT_EQ(r.stats.recomputed_token_layers, exact_tokens);  // layer 1: the selected lines and the heads
  // The rules at position 0 and the query are exact.
  EXPECT_LT(max_diff(w.k(1).narrow(1, 0, 8), ref_w.k(1).narrow(1, 0, 8)), 1e-5);
  EXPECT_LT(max_diff(w.k(1).narrow(1, off.back() - 6, 6), ref_w.k(1).narrow(1, off.back() - 6, 6)), 1e-5);
}

TEST(Recompute, RecomputedTokensGetTheKvOfAFullPrefillAndTheOthersTheCachedKv) {
  for (int head_tokens : {0, 1, 3}) {
    SCOPED_TRACE("head_tokens " + std::to_string(head_tokens));
    expect_selected_lines_exact_and_the_others_cached(make_prompt(), head_tokens);
  }
}

TEST(Recompute, ALongPromptsRowsRunInChunksWithTheSameResults) {
  // 60 lines, 468 tokens: the executor's attention takes the carried rows 128 at a time, each
  // chunk reading the keys up to its last row. Scattered rows (the selected lines and the query)
  // and dense ones (every token) must give what one full prefill gives.
  const auto prompt = make_prompt(3, 60);
  ASSERT_GT(segment_offsets(prompt).back(), 3 * 128);
  expect_selected_lines_exact_and_the_others_cached(prompt, 3);
  LlmModel m = model_of(3);
  KvWindow ref_w = window_for(*m);
  const at::Tensor ref = full_prefill(*m, prompt, ref_w);
  for (const std::string name : {"cacheblend", "keep"}) {
    ChunkCache cache(m, cache_config());
    auto policy = make_recompute_policy(policy_config(name, 1.0));
    KvWindow w = window_for(*m);
    const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
    EXPECT_LT(max_diff(r.logits, ref), 1e-5) << name;
    for (int l = 0; l < 3; ++l) {
      EXPECT_LT(max_diff(w.k(l), ref_w.k(l)), 1e-5) << name << " layer " << l;
      EXPECT_LT(max_diff(w.v(l), ref_w.v(l)), 1e-5) << name << " layer " << l;
    }
  }
}

TEST(Recompute, PrefixCacheReusesTheUnchangedPrefixExactly) {
  LlmModel m = model_of(3);
  ChunkCache cache(m, cache_config());
  auto policy = make_recompute_policy(policy_config("prefix_cache"));
  auto prompt = make_prompt();
  KvWindow w = window_for(*m);
  EXPECT_EQ(prefill_with_reuse(cache, *policy, prompt, w).stats.reused_tokens, 0);
  prompt[4].ids = random_ids(7, 999);  // m3 changes: rules, m0..m2 stay a prefix
  const std::vector<int64_t> off = segment_offsets(prompt);
  KvWindow ref_w = window_for(*m);
  const at::Tensor ref = full_prefill(*m, prompt, ref_w);
  const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
  EXPECT_EQ(r.stats.reused_tokens, off[4]);
  EXPECT_LT(max_diff(r.logits, ref), 1e-5);
  for (int l = 0; l < 3; ++l) EXPECT_LT(max_diff(w.k(l), ref_w.k(l)), 1e-5);
}

TEST(Recompute, BalancedAndNextLayerLoadingComputeTheSame) {
  LlmModel m = model_of(4);
  const auto prompt = make_prompt();
  const std::string dir = fresh_dir("wm_test_recompute_load");
  at::Tensor logits[2];
  int i = 0;
  for (const std::string name : {"keep", "keep_next_layer"}) {
    ChunkCache cache(m, cache_config(dir, 0));  // every entry on disk
    auto policy = make_recompute_policy(policy_config(name, 0.3));
    KvWindow w = window_for(*m);
    prefill_with_reuse(cache, *policy, prompt, w);
    const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
    EXPECT_GT(r.stats.loaded_token_layers[static_cast<int>(Tier::Disk)], 0) << name;
    EXPECT_GT(r.stats.recomputed_fraction(), 0.0);
    EXPECT_LT(r.stats.recomputed_fraction(), 0.75);  // layer 1 all, 2-3 the selection and the heads
    logits[i++] = r.logits;
  }
  EXPECT_TRUE(logits[0].equal(logits[1]));
  fs::remove_all(dir);
}

TEST(MultiHop, ReachesAUnitThatOneHopMisses) {
  // Units A..E of 10 tokens, room for two. The query looks at C most, then D; C looks at A.
  const std::vector<double> direct = {0.05, 0.10, 0.50, 0.20, 0.15};
  const std::vector<int64_t> tokens(5, 10);
  const std::vector<char> candidate(5, 1);
  std::vector<std::vector<double>> attn(5, std::vector<double>(5, 0.0));
  attn[2][0] = 0.9, attn[2][2] = 0.1;  // C -> A
  attn[3][1] = 0.3, attn[3][3] = 0.7;  // D -> B, weakly
  attn[0][0] = 1.0;
  std::vector<int> asked;
  auto rows = [&](const std::vector<int>& from) {
    std::vector<std::vector<double>> out;
    for (int u : from) out.push_back(attn[u]), asked.push_back(u);
    return out;
  };
  EXPECT_EQ(top_within_budget(direct, tokens, candidate, 20), (std::vector<int>{2, 3}));  // one hop: C, D
  const MultiHopSelection sel = multi_hop_select(direct, tokens, candidate, 20, rows, 8);
  EXPECT_EQ(sel.selected, (std::vector<int>{0, 2}));  // C and, through it, A
  EXPECT_GE(sel.hops, 2);                             // a change, then a settled round
  EXPECT_NEAR(sel.scores[0], 0.05 + 0.5 * 0.9, 1e-12);
  // Rows are asked once per selected unit, lazily.
  std::sort(asked.begin(), asked.end());
  EXPECT_EQ(asked, (std::vector<int>{0, 2, 3}));
  // A budget left unused by a big unit goes to smaller ones; non-candidates are never chosen.
  EXPECT_EQ(top_within_budget({0.9, 0.5, 0.4}, {30, 10, 10}, {1, 1, 1}, 20), (std::vector<int>{1, 2}));
  EXPECT_EQ(top_within_budget({0.9, 0.5, 0.4}, {10, 10, 10}, {0, 1, 1}, 20), (std::vector<int>{1, 2}));
}

TEST(Recompute, KeepSelectsWholeUnitsThroughTheModelsAttention) {
  LlmModel m = model_of(4);
  const auto prompt = make_prompt();
  for (int head_tokens : {0, 2}) {
    ChunkCache cache(m, cache_config());
    auto policy = make_recompute_policy(keep_config(1, head_tokens));
    KvWindow w = window_for(*m);
    const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
    // Units recomputed whole, the others' heads: the tokens after the check layer are whole lines'
    // tokens plus head_tokens for each line left out.
    const int64_t reused = 45;  // m0..m5; the rules are exact (at position 0)
    ASSERT_EQ(r.stats.memory_tokens, 53);
    const int64_t after = r.stats.recomputed_token_layers - reused;  // layer 1: everything
    ASSERT_EQ(after % 2, 0);  // layers 2 and 3 carry the same selection
    const int64_t carried = after / 2;
    int lines = -1;  // how many whole lines (sizes 5..10) make it up
    for (int mask = 1; mask < 64 && lines < 0; ++mask) {
      int64_t s = 0;
      int n = 0;
      for (int i = 0; i < 6; ++i)
        if (mask & (1 << i)) s += 5 + i, ++n;
      if (s <= static_cast<int64_t>(std::ceil(0.3 * 45)) && s + head_tokens * (6 - n) == carried) lines = n;
    }
    EXPECT_GT(lines, 0) << "head_tokens " << head_tokens << ": " << carried << " tokens carried";
  }
}

TEST(KeepMemory, AnUpdateToOneDynamicSegmentInvalidatesOnlyItsBlock) {
  LlmModel m = model_of(2);
  ChunkCache cache(m, cache_config());
  auto policy = make_recompute_policy(policy_config("keep"));
  auto prompt = make_prompt();
  KvWindow w = window_for(*m);
  prefill_with_reuse(cache, *policy, prompt, w);
  std::vector<ChunkKey> before = cache.keys();
  std::sort(before.begin(), before.end());
  const ChunkKey old_m2 = cache.chunk_key(prompt[3].ids);
  prompt[3].ids = random_ids(7, 4242);  // m2 changes
  const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
  EXPECT_EQ(r.stats.misses, 1);
  EXPECT_EQ(r.stats.prefilled_tokens, 7);
  std::vector<ChunkKey> after = cache.keys();
  std::sort(after.begin(), after.end());
  std::vector<ChunkKey> expect;
  for (ChunkKey k : before)
    if (k != old_m2) expect.push_back(k);
  expect.push_back(cache.chunk_key(prompt[3].ids));
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(after, expect);  // exactly the old block gone, the new one in, the others untouched
  EXPECT_EQ(cache.stats().erased, 1);
}

TEST(KeepMemory, StaticSegmentsFormGroupsCachedAsOneBlock) {
  LlmModel m = model_of(2);
  ChunkCache cache(m, cache_config());
  KeepMemory mem(/*static_after*/ 2, /*similarity*/ -1.0, /*max_group_tokens*/ 15, true);
  auto prompt = make_prompt();
  auto run = [&](const KeepMemory::Construction& c) {  // what the executor does with the entries
    for (const auto& u : c.units)
      if (!cache.contains(u.key)) {
        std::vector<int64_t> ids;
        for (int s = u.first; s < u.last; ++s) ids.insert(ids.end(), prompt[s].ids.begin(), prompt[s].ids.end());
        cache.put(u.key, cache.prefill(ids), u.kind);
      }
    for (const auto& b : c.builds) cache.put(b.key, cache.prefill(b.ids), b.kind);
  };
  auto c1 = mem.construct(prompt, cache);
  EXPECT_EQ(c1.units.size(), 7u);  // all dynamic, one by one
  EXPECT_TRUE(c1.builds.empty());
  run(c1);
  prompt[5].ids = random_ids(9, 77);  // m4 changes at step 2
  run(mem.construct(prompt, cache));
  auto c3 = mem.construct(prompt, cache);  // step 3: everything but m4 unchanged for 2 steps
  // Groups of at most 15 tokens among consecutive static segments: rules+m0 (13), m1+m2 (13),
  // then m3 (8) alone before the dynamic m4, and m5 (10) alone after it.
  const auto groups = mem.groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<std::string>{"rules", "m0"}));
  EXPECT_EQ(groups[1], (std::vector<std::string>{"m1", "m2"}));
  EXPECT_EQ(c3.builds.size(), 2u);  // built after this step; this step still one by one
  EXPECT_EQ(c3.units.size(), 7u);
  run(c3);
  auto c4 = mem.construct(prompt, cache);
  ASSERT_EQ(c4.units.size(), 5u);
  EXPECT_EQ(c4.units[0].kind, "group");
  EXPECT_TRUE(c4.units[0].exact);
  EXPECT_EQ(c4.units[1].kind, "group");
  EXPECT_FALSE(c4.units[1].exact);
  EXPECT_EQ(c4.units[1].n_tokens(), 13);
  // The group's block keeps the attention inside it: its K/V are the segments computed together.
  std::vector<int64_t> ids = prompt[2].ids;
  ids.insert(ids.end(), prompt[3].ids.begin(), prompt[3].ids.end());
  const ChunkKv together = cache.prefill(ids);
  const LayerKv group = cache.layer(c4.units[1].key, 1);
  EXPECT_LT(max_diff(group.k, together.layers[1].k), 1e-6);
  // ... which differ from m2's alone moved to its place in the group: m2 attends to m1 there.
  const ChunkKv m2_alone = cache.prefill(prompt[3].ids, 6);
  EXPECT_GT(max_diff(group.k.narrow(1, 6, 7), m2_alone.layers[1].k), 1e-4);
  EXPECT_LT(max_diff(group.k.narrow(1, 0, 6), cache.prefill(prompt[2].ids).layers[1].k), 1e-5);
  // A change inside a group dissolves it: its block is erased, its segments dynamic again.
  prompt[3].ids = random_ids(6, 78);
  auto c5 = mem.construct(prompt, cache);
  EXPECT_EQ(mem.groups().size(), 1u);
  EXPECT_FALSE(cache.contains(c4.units[1].key));
  EXPECT_EQ(c5.units.size(), 6u);
}

// The spill file of layer l of an entry (its block id, made file-safe, starts the name).
std::string spill_file_of(const std::string& dir, const ChunkCache& cache, ChunkKey key, int l) {
  std::string id = cache.block_id(key, l);
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(id + "-", 0) == 0) return e.path().string();
  return "";
}

void damage(const std::string& path) {
  ASSERT_TRUE(wm::test::flip_byte(path, fs::file_size(path) - 20));
}

TEST(Recompute, ADamagedSpillFileIsReportedAndItsSegmentRecomputedNeverUsed) {
  LlmModel m = model_of(3);
  const auto prompt = make_prompt();
  for (const std::string name : {"full_reuse", "keep", "prefix_cache"}) {
    const std::string dir = fresh_dir("wm_test_recompute_corrupt");
    ChunkCache cache(m, cache_config(dir, 0));  // every entry spills to disk
    auto policy = make_recompute_policy(policy_config(name, 0.3));
    KvWindow w = window_for(*m);
    const ReuseResult clean = prefill_with_reuse(cache, *policy, prompt, w);
    policy->reset();
    const ReuseResult warm = prefill_with_reuse(cache, *policy, prompt, w);
    policy->reset();
    // Damage layer 2 of an entry the prompt surely loads: memory line m3's (full_reuse), its prefix
    // entry (prefix_cache), the rules' (keep, which may recompute m3 but loads the exact rules).
    const ChunkKey key = name == "prefix_cache"
                             ? cache.prefix_keys({prompt[0].ids, prompt[1].ids, prompt[2].ids, prompt[3].ids,
                                                  prompt[4].ids})[4]
                             : cache.chunk_key(prompt[name == "keep" ? 0 : 4].ids);
    ASSERT_TRUE(cache.contains(key)) << name;
    const std::string file = spill_file_of(dir, cache, key, 2);
    ASSERT_FALSE(file.empty()) << name;
    damage(file);
    const ReuseResult r = prefill_with_reuse(cache, *policy, prompt, w);
    EXPECT_EQ(r.stats.corrupt, 1) << name;
    EXPECT_EQ(r.stats.attempts, 2) << name;
    ASSERT_EQ(cache.corrupt_reports().size(), 1u) << name;
    EXPECT_NE(cache.corrupt_reports()[0].find(key_hex(key)), std::string::npos);
    EXPECT_EQ(cache.stats().corrupt, 1);
    // Recomputed, not used: the result is the undamaged one, and the entry is whole again.
    EXPECT_LT(max_diff(r.logits, warm.logits), 1e-5) << name;
    EXPECT_LT(max_diff(r.logits, clean.logits), 1e-5) << name;
    EXPECT_TRUE(cache.contains(key)) << name;
    const ReuseResult again = prefill_with_reuse(cache, *policy, prompt, w);
    EXPECT_EQ(again.stats.corrupt, 0) << name;
    EXPECT_LT(max_diff(again.logits, warm.logits), 1e-5) << name;
    fs::remove_all(dir);
  }
}

TEST(Recompute, BadInputsAreErrors) {
  LlmModel m = model_of(2);
  ChunkCache cache(m, cache_config());
  auto policy = make_recompute_policy(policy_config("keep"));
  KvWindow w = window_for(*m);
  auto prompt = make_prompt();
  prompt.back().reusable = true;  // the last token must be fresh
  EXPECT_THROW(prefill_with_reuse(cache, *policy, prompt, w), Error);
  EXPECT_THROW(prefill_with_reuse(cache, *policy, {}, w), Error);
  EXPECT_THROW(make_recompute_policy(policy_config("nope")), Error);
  EXPECT_THROW(make_recompute_policy(policy_config("keep", 0.0)), Error);
  EXPECT_THROW(make_recompute_policy(policy_config("keep", 1.5)), Error);
  RecomputeConfig rc = policy_config("cacheblend");
  rc.check_layers = {0};
  auto cb = make_recompute_policy(rc);
  EXPECT_THROW(prefill_with_reuse(cache, *cb, make_prompt(), w), Error);
}

}  // namespace recompute_test
}  // namespace wm::llm
