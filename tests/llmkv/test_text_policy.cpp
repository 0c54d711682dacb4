// The text memory policies: which tokens each keeps on constructed cases, the plans applied to a
// real window, and the session running them end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "llm_test_util.h"
#include "llmkv/session.h"
#include "llmkv/text_policy.h"
#include "llmkv/tokenizer.h"
#include "runtime/attention.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm::llm {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace text_policy_test {

constexpr int64_t kVocab = 61;

// A memory in the small test model's layout holding n tokens at positions 0..n-1 in every layer,
// their raw (unrotated) keys returned for checks.
struct Filled {
  KvMemory memory;
  at::Tensor raw;  // [n_kv_heads, n, head_dim]
};

Filled filled(int64_t n) {
  const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
  Filled f{KvMemory(spec, {"system", "blocks", "recent"}, StoreConfig{}), at::randn({spec.n_kv_heads, n, spec.head_dim})};
  const at::Tensor pos = at::arange(n, at::kLong).unsqueeze(1);
  for (int l = 0; l < spec.n_layers; ++l)
    f.memory.window().append("recent", "recent", l, apply_rope(f.raw, pos, spec.rope), f.raw * 2, pos);
  return f;
}

TextMemoryConfig config(const std::string& policy, int64_t budget) {
  TextMemoryConfig c;
  c.policy = policy;
  c.budget = budget;
  return c;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> v(b - a);
  std::iota(v.begin(), v.end(), a);
  return v;
}

// Mass with every key at `base` except the ones given, per layer [n_kv_heads, n].
std::vector<at::Tensor> mass(int layers, int64_t heads, int64_t n, const std::vector<std::pair<int64_t, double>>& hot,
                             double base = 0.01) {
  std::vector<at::Tensor> out;
  for (int l = 0; l < layers; ++l) {
    at::Tensor m = at::full({heads, n}, base);
    for (auto [i, x] : hot) m.select(1, i).fill_(x);
    out.push_back(m);
  }
  return out;
}

// A step of `fresh` tokens that showed this key mass.
StepView view(std::vector<at::Tensor> key_mass, int64_t fresh) {
  StepView v;
  v.fresh = fresh;
  v.key_mass = std::move(key_mass);
  return v;
}

std::vector<int64_t> positions(const KvWindow& w, int l) {
  const at::Tensor p = w.pos(l).select(1, 0).contiguous();
  return std::vector<int64_t>(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
}

TEST(TextPolicy, RegistryKnowsThePoliciesAndRejectsBadConfigs) {
  EXPECT_EQ(text_policy_names(),
            (std::vector<std::string>{"full", "recency", "streaming_llm", "h2o", "snapkv", "pyramidkv", "snapkv_layer",
                                      "pyramidkv_layer", "adakv", "keepkv", "keepkv_ev", "keepkv_layer", "keepkv_ev_layer",
                                      "evoke", "evoke_discard",
                                      "evoke_breadcrumb"}));
  for (const auto& name : text_policy_names()) EXPECT_EQ(make_text_policy(config(name, 64))->name(), name);
  EXPECT_THROW(make_text_policy(config("nope", 64)), Error);
  EXPECT_THROW(make_text_policy(config("h2o", 0)), Error);            // a budget is needed
  EXPECT_THROW(make_text_policy(config("streaming_llm", 4)), Error);  // no room beside 4 sinks
  EXPECT_NO_THROW(make_text_policy(config("full", 0)));
}

TEST(TextPolicy, RecencyKeepsTheLastTokens) {
  Filled f = filled(20);
  auto p = make_text_policy(config("recency", 8));
  f.memory.apply(p->observe(f.memory, view({}, 20)));
  for (int l = 0; l < f.memory.spec().n_layers; ++l) EXPECT_EQ(positions(f.memory.window(), l), range(12, 20));
  // With a slack of 3 a layer over budget is cut to 5; below the budget nothing happens.
  Filled g = filled(20);
  TextMemoryConfig c = config("recency", 8);
  c.slack = 3;
  auto q = make_text_policy(c);
  g.memory.apply(q->observe(g.memory, view({}, 20)));
  for (int l = 0; l < g.memory.spec().n_layers; ++l) EXPECT_EQ(positions(g.memory.window(), l), range(15, 20));
  const at::Tensor pos = at::arange(20, 23, at::kLong).unsqueeze(1);
  for (int l = 0; l < g.memory.spec().n_layers; ++l)
    g.memory.window().append("recent", "recent", l, at::randn({g.memory.spec().n_kv_heads, 3, g.memory.spec().head_dim}),
                             at::randn({g.memory.spec().n_kv_heads, 3, g.memory.spec().head_dim}), pos);
  EXPECT_TRUE(q->observe(g.memory, view({}, 3)).empty());  // 8 tokens: at the budget
  c.slack = 8;
  EXPECT_THROW(make_text_policy(c), Error);  // no budget left
}

// The sinks and the most recent tokens stay; the recent ones are re-anchored right after the
// sinks (keys equal to RoPE of their raw keys at the new positions), and the next token follows.
TEST(TextPolicy, StreamingLlmKeepsSinksAndRecentReanchored) {
  Filled f = filled(20);
  auto p = make_text_policy(config("streaming_llm", 10));  // 4 sinks + 6 recent
  f.memory.apply(p->observe(f.memory, view({}, 20)));
  const KvWindow& w = f.memory.window();
  const KvSpec& spec = f.memory.spec();
  std::vector<int64_t> kept = range(0, 4), tail = range(14, 20);
  kept.insert(kept.end(), tail.begin(), tail.end());
  const at::Tensor idx = at::tensor(kept, at::kLong);
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_EQ(positions(w, l), range(0, 10));
    const at::Tensor want = apply_rope(f.raw.index_select(1, idx), at::arange(10, at::kLong).unsqueeze(1), spec.rope);
    EXPECT_LE((w.k(l) - want).abs().max().item<double>(), 1e-5) << l;
    EXPECT_TRUE(w.v(l).equal(f.raw.index_select(1, idx) * 2)) << l;
  }
  EXPECT_EQ(p->next_position(w, 20), 10);
}

// A key that got much attention in an early step stays through later steps that do not look at
// it (accumulated, not last-step, mass); the recent half of the budget always stays.
TEST(TextPolicy, H2oKeepsTheAccumulatedHeavyHitter) {
  Filled f = filled(12);
  const int L = f.memory.spec().n_layers;
  const int64_t KH = f.memory.spec().n_kv_heads;
  auto p = make_text_policy(config("h2o", 8));  // 4 heavy + 4 recent
  f.memory.apply(p->observe(f.memory, view(mass(L, KH, 12, {{2, 5.0}, {5, 1.0}, {7, 0.5}}), 12)));
  // 12 tokens for 8: the recent 8..11, and 2, 5, 7 and the best of the rest (a tie: the earliest, 0).
  EXPECT_EQ(positions(f.memory.window(), 0), (std::vector<int64_t>{0, 2, 5, 7, 8, 9, 10, 11}));
  // Four more tokens; this step favours 0 and 8 a little, never 2.
  const at::Tensor pos = at::arange(12, 16, at::kLong).unsqueeze(1);
  for (int l = 0; l < L; ++l)
    f.memory.window().append("recent", "recent", l, at::randn({KH, 4, f.memory.spec().head_dim}),
                             at::randn({KH, 4, f.memory.spec().head_dim}), pos);
  at::Tensor m = at::full({KH, 12}, 0.01);
  m.select(1, 0).fill_(0.6);  // window index 0 = position 0
  m.select(1, 4).fill_(0.6);  // window index 4 = position 8
  f.memory.apply(p->observe(f.memory, view(std::vector<at::Tensor>(L, m), 4)));
  // Accumulated over both steps (two heads): 2 (10.02), 5 (2.02), 0 and 8 (1.22 each) stay, 7
  // (1.02) goes; the recent 12..15.
  EXPECT_EQ(positions(f.memory.window(), 1), (std::vector<int64_t>{0, 2, 5, 8, 12, 13, 14, 15}));
}

// The observation window's votes, max-pooled over 7 neighbouring keys, pick the target and its
// neighbourhood; the window's own tokens stay.
TEST(TextPolicy, SnapKvKeepsTheObservationWindowsTarget) {
  Filled f = filled(64);
  const int L = f.memory.spec().n_layers;
  const int64_t KH = f.memory.spec().n_kv_heads;
  TextMemoryConfig c = config("snapkv", 16);
  c.window = 8;
  c.kernel = 3;
  auto p = make_text_policy(c);
  EXPECT_EQ(p->step_needs().mass_queries, 8);
  f.memory.apply(p->observe(f.memory, view(mass(L, KH, 64, {{20, 3.0}, {40, 2.0}}), 64)));
  // 8 window tokens (56..63) and 8 by votes: 19-21 and 39-41 pooled from the two targets, then
  // the earliest of the even rest (0, 1).
  EXPECT_EQ(positions(f.memory.window(), 0),
            (std::vector<int64_t>{0, 1, 19, 20, 21, 39, 40, 41, 56, 57, 58, 59, 60, 61, 62, 63}));
  // A decoded token is kept: SnapKV compresses prompts only.
  const size_t before = f.memory.window().size(0);
  EXPECT_TRUE(p->observe(f.memory, view(mass(L, KH, before, {}), 1)).empty());
}

TEST(TextPolicy, PyramidBudgetsShrinkUpwardsAndSumToTheTotal) {
  for (int L : {1, 2, 6, 24, 28})
    for (int64_t B : {40, 64, 100, 1000}) {
      const auto b = pyramid_budgets(B, L, 20.0, 33);
      EXPECT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}), B * L) << L << " " << B;
      for (int l = 1; l < L; ++l) EXPECT_LE(b[l], b[l - 1]) << L << " " << B;
      if (L > 1 && B > 33) EXPECT_GT(b.front(), b.back());
      for (int64_t x : b) EXPECT_GE(x, std::min<int64_t>(B, 33));
    }
  // Layers of the small model at budget 48 with window 8: pyramidkv's total equals snapkv's.
  Filled f = filled(96);
  TextMemoryConfig c = config("pyramidkv", 48);
  c.window = 8;
  auto p = make_text_policy(c);
  const int L = f.memory.spec().n_layers;
  f.memory.apply(p->observe(f.memory, view(mass(L, f.memory.spec().n_kv_heads, 96, {}), 96)));
  int64_t total = 0;
  for (int l = 0; l < L; ++l) total += f.memory.window().size(l);
  EXPECT_EQ(total, 48 * L);
  EXPECT_GT(f.memory.window().size(0), f.memory.window().size(L - 1));
}

// KeepKV on a constructed case: 12 entries for a budget of 8 (recent 2). The four entries with
// the least attention merge, each into the kept entry with the most similar key; token 3 is
// built as a near copy of token 1, so it joins 1. For the step's query the attention output over
// the window is unchanged (ZIP); keepkv_ev, same choices, moves it.
TEST(TextPolicy, KeepKvMergesTheLeastAttendedIntoTheirNearestKeyLosslessly) {
  const int64_t n = 12;
  for (const std::string name : {"keepkv_layer", "keepkv_ev_layer"}) {
    at::manual_seed(5);  // the same case for both
    Filled f = filled(n);
    const KvSpec& spec = f.memory.spec();
    const int L = spec.n_layers;
    const int64_t KH = spec.n_kv_heads;
    // Token 3's key := token 1's as the window holds it, slightly perturbed.
    for (int l = 0; l < L; ++l) {
      at::Tensor k = f.memory.window().k(l);
      k.select(1, 3).copy_(k.select(1, 1) + 0.01 * at::randn({KH, spec.head_dim}));
    }
    // Attention: low for 3, 4, 6, 9; high elsewhere.
    auto mass = [&](int l) {
      (void)l;
      at::Tensor m = at::full({KH, n}, 1.0);
      for (int64_t i : {3, 4, 6, 9}) m.select(1, i).fill_(0.01);
      return m;
    };
    StepView v;
    v.fresh = n;
    std::vector<at::Tensor> before;
    for (int l = 0; l < L; ++l) {
      v.key_mass.push_back(mass(l));
      v.query.push_back(at::randn({KH, spec.head_dim}));
    }
    auto attend = [&](int l) {
      AttentionOptions ao;
      ao.n_window = f.memory.window().size(l);
      return attention(v.query[l].unsqueeze(1), f.memory.window().k(l), f.memory.window().v(l),
                       f.memory.window().logw(l), ao)
          .out;
    };
    for (int l = 0; l < L; ++l) before.push_back(attend(l));
    TextMemoryConfig c = config(name, 8);
    c.recent = 2;
    c.score_kernel = 1;  // the scores as they are
    auto p = make_text_policy(c);
    EXPECT_TRUE(p->step_needs().key_mass && p->step_needs().query);
    f.memory.apply(p->observe(f.memory, v));
    for (int l = 0; l < L; ++l) {
      EXPECT_EQ(positions(f.memory.window(), l), (std::vector<int64_t>{0, 1, 2, 5, 7, 8, 10, 11})) << name;
      // Entry 1 (index 1) holds tokens 1 and 3 (and whichever other source found its key nearest).
      EXPECT_GE(f.memory.window().logw(l)[1].item<double>(), std::log(2.0) - 1e-6) << name;
      // Four votes merged in, twelve in all.
      EXPECT_NEAR(f.memory.window().logw(l).exp().sum().item<double>(), 12.0, 1e-4) << name;
      const double diff = (attend(l) - before[l]).abs().max().item<double>();
      if (name == "keepkv_layer")
        EXPECT_LE(diff, 1e-5) << "layer " << l;
      else
        EXPECT_GT(diff, 1e-3) << "layer " << l;
    }
  }
}

// KeepKV's scores over a prompt come from its last score_window queries (SnapKV's observation
// window), each key's mass divided by the window queries that see it: with every query giving
// each key it sees the same attention, the window's own tokens score as high as the ones before
// it although fewer queries reach them. 12 tokens, window 4 (queries 8..11), budget 8, recent 2:
// the four keys with the least attention per query (2, 4, 6, 7) merge, and 9, which three queries
// see, stays (by its summed mass, 0.3 against their 0.32, it would be the one to go).
TEST(TextPolicy, KeepKvScoresByTheWindowsAttentionPerQuery) {
  const int64_t n = 12, window = 4;
  Filled f = filled(n);
  const int L = f.memory.spec().n_layers;
  const int64_t KH = f.memory.spec().n_kv_heads;
  TextMemoryConfig c = config("keepkv_layer", 8);
  c.recent = 2;
  c.score_window = window;
  c.score_kernel = 1;
  auto p = make_text_policy(c);
  EXPECT_EQ(p->step_needs().mass_queries, window);
  StepView v;
  v.fresh = n;
  for (int l = 0; l < L; ++l) {
    at::Tensor m = at::empty({KH, n});
    for (int64_t j = 0; j < n; ++j) {
      const bool low = j == 2 || j == 4 || j == 6 || j == 7;
      m.select(1, j).fill_((low ? 0.08 : 0.1) * static_cast<double>(std::min(window, n - j)));
    }
    v.key_mass.push_back(m);
    v.query.push_back(at::randn({KH, f.memory.spec().head_dim}));
  }
  f.memory.apply(p->observe(f.memory, v));
  for (int l = 0; l < L; ++l)
    EXPECT_EQ(positions(f.memory.window(), l), (std::vector<int64_t>{0, 1, 3, 5, 8, 9, 10, 11})) << "layer " << l;
}

// KeepKV's scores max-pooled over score_kernel (3) neighbours before the choice: one key with
// high attention keeps its neighbours, the peak itself first. 16 tokens, budget 6, recent 2:
// keys 5 (the peak) and 4, 6 (its neighbours, tied when pooled) and key 11 (second peak, whose
// plateau is 10-12; its neighbours go since no room is left after 11): 4 of the 14 candidates.
TEST(TextPolicy, KeepKvPoolsItsScoresSoAKeptKeyBringsItsNeighbours) {
  const int64_t n = 16;
  Filled f = filled(n);
  const int L = f.memory.spec().n_layers;
  const int64_t KH = f.memory.spec().n_kv_heads;
  TextMemoryConfig c = config("keepkv_layer", 6);
  c.recent = 2;
  c.score_kernel = 3;
  c.score_window = 0;
  StepView v;
  v.fresh = 1;  // one query: every key's mass counts as it is
  for (int l = 0; l < L; ++l) {
    at::Tensor m = at::full({KH, n}, 0.01);
    m.select(1, 5).fill_(0.5);
    m.select(1, 11).fill_(0.3);
    m.select(1, 12).fill_(0.02);  // a little above the rest: without pooling, it would be kept
    v.key_mass.push_back(m);
    v.query.push_back(at::randn({KH, f.memory.spec().head_dim}));
  }
  auto p = make_text_policy(c);
  f.memory.apply(p->observe(f.memory, v));
  for (int l = 0; l < L; ++l)
    EXPECT_EQ(positions(f.memory.window(), l), (std::vector<int64_t>{4, 5, 6, 11, 14, 15})) << "layer " << l;
  // The same case without pooling keeps the four highest as they are.
  Filled g = filled(n);
  c.score_kernel = 1;
  auto q = make_text_policy(c);
  g.memory.apply(q->observe(g.memory, v));
  EXPECT_EQ(positions(g.memory.window(), 0), (std::vector<int64_t>{0, 5, 11, 12, 14, 15}));
}

// A prompt step restarts keepkv's scores from its own attention (prompt_restart): a key that
// the first prompt attended to heavily and the second ignores goes, where the moving average
// would keep it. 10 tokens (key 2 heavy), then 4 more over a budget of 10: four entries merge.
TEST(TextPolicy, KeepKvPromptStepRestartsItsScores) {
  for (const bool restart : {true, false}) {
    at::manual_seed(3);
    Filled f = filled(10);
    const KvSpec& spec = f.memory.spec();
    const int L = spec.n_layers;
    const int64_t KH = spec.n_kv_heads;
    TextMemoryConfig c = config("keepkv_layer", 10);
    c.recent = 2;
    c.score_kernel = 1;
    c.prompt_restart = restart;
    auto p = make_text_policy(c);
    auto step = [&](int64_t n, int64_t fresh, int64_t hot, double hot_mass, int64_t cold) {
      StepView v;
      v.fresh = fresh;
      for (int l = 0; l < L; ++l) {
        at::Tensor m = at::full({KH, n}, 0.01);
        m.select(1, hot).fill_(hot_mass);
        if (cold >= 0) m.select(1, cold).fill_(0.0001);
        v.key_mass.push_back(m);
        v.query.push_back(at::randn({KH, spec.head_dim}));
      }
      f.memory.apply(p->observe(f.memory, v));
    };
    step(10, 10, 2, 5.0, -1);
    const at::Tensor pos = at::arange(10, 14, at::kLong).unsqueeze(1);
    for (int l = 0; l < L; ++l)
      f.memory.window().append("recent", "recent", l, at::randn({KH, 4, spec.head_dim}), at::randn({KH, 4, spec.head_dim}),
                               pos);
    step(14, 4, 5, 0.5, 2);
    for (int l = 0; l < L; ++l) {
      const auto kept = positions(f.memory.window(), l);
      EXPECT_EQ(kept.size(), 10u);
      EXPECT_EQ(std::count(kept.begin(), kept.end(), 2), restart ? 0 : 1) << "restart " << restart << " layer " << l;
      EXPECT_EQ(std::count(kept.begin(), kept.end(), 5), 1) << "restart " << restart << " layer " << l;
    }
  }
}

// KeepKV's periodic refresh: originals that merges change go to the bank, and a refresh step
// rebuilds each layer from the full KV (window originals + banked ones) by ZIP-merging at that
// step's query, so that for it the window's attention output equals the full KV's (1e-5), which
// after several merges at other queries it no longer did; the window keeps its size.
TEST(TextPolicy, KeepKvRefreshRebuildsTheWindowFromTheFullKvInTheBank) {
  at::manual_seed(21);
  const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
  const int L = spec.n_layers;
  const int64_t KH = spec.n_kv_heads, d = spec.head_dim;
  for (const int64_t every : {int64_t{0}, int64_t{4}}) {
    at::manual_seed(21);
    KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{at::kCPU, 0});
    TextMemoryConfig c = config("keepkv_layer", 10);
    c.recent = 2;
    c.refresh_every = every;
    auto p = make_text_policy(c);
    std::vector<at::Tensor> full_k(L), full_v(L);  // every token ever, as the window first held it
    at::Tensor last_q;
    std::vector<at::Tensor> queries;
    for (int step = 0; step < 8; ++step) {  // 3 tokens a step: 24 in all
      const at::Tensor pos = at::arange(3 * step, 3 * step + 3, at::kLong).unsqueeze(1);
      StepView v;
      v.fresh = 3;
      queries.clear();
      for (int l = 0; l < L; ++l) {
        const at::Tensor k = at::randn({KH, 3, d}), val = at::randn({KH, 3, d});
        mem.window().append("recent", "recent", l, k, val, pos);
        full_k[l] = full_k[l].defined() ? at::cat({full_k[l], k}, 1) : k;
        full_v[l] = full_v[l].defined() ? at::cat({full_v[l], val}, 1) : val;
        v.key_mass.push_back(at::rand({KH, mem.window().size(l)}));
        v.query.push_back(at::randn({KH, d}));
      }
      mem.apply(p->observe(mem, v));
      queries = v.query;
      for (int l = 0; l < L; ++l) EXPECT_LE(mem.window().size(l), 10) << "step " << step;
    }
    // Step 8 is a refresh step (8 % 4 == 0): compare the window with the full KV at its query.
    double worst = 0;
    for (int l = 0; l < L; ++l) {
      AttentionOptions ao;
      ao.n_window = mem.window().size(l);
      const at::Tensor win = attention(queries[l].unsqueeze(1), mem.window().k(l), mem.window().v(l),
                                       mem.window().logw(l), ao).out;
      ao.n_window = full_k[l].size(1);
      const at::Tensor full = attention(queries[l].unsqueeze(1), full_k[l], full_v[l], at::zeros({full_k[l].size(1)}), ao).out;
      worst = std::max(worst, (win - full).abs().max().item<double>());
      // Votes: every token counted once.
      EXPECT_NEAR(mem.window().logw(l).exp().sum().item<double>(), 24.0, 1e-3) << every;
      EXPECT_EQ(mem.window().size(l), 10) << every;
    }
    if (every == 0) {
      EXPECT_GT(worst, 1e-3) << "without a refresh the merged window drifts from the full KV";
      EXPECT_EQ(mem.bank().size(), 0u);
    } else {
      EXPECT_LE(worst, 1e-5) << "a refresh step is lossless against the full KV";
      EXPECT_GT(mem.bank().size(), 0u);
      EXPECT_GT(mem.bank().bytes(Tier::Host), 0u);
    }
  }
}

// Feeds `n` blocks b0, b1, ... of 6 tokens each (random raw keys, RoPE'd at positions 6b..6b+5,
// values twice the raw keys) to the policy, a step each; returns the raw keys.
std::vector<at::Tensor> feed_blocks(KvMemory& mem, TextPolicy& p, int n) {
  const KvSpec& spec = mem.spec();
  std::vector<at::Tensor> raw;
  for (int b = 0; b < n; ++b) {
    raw.push_back(at::randn({spec.n_kv_heads, 6, spec.head_dim}));
    const at::Tensor pos = at::arange(6 * b, 6 * b + 6, at::kLong).unsqueeze(1);
    for (int l = 0; l < spec.n_layers; ++l)
      mem.window().append("blocks", "b" + std::to_string(b), l, apply_rope(raw[b], pos, spec.rope), raw[b] * 2, pos);
    mem.apply(p.observe(mem, view({}, 6)));
    EXPECT_LE(mem.window().size(0), p.config().budget) << p.name() << " after block " << b;
  }
  return raw;
}

// A 2-token message probe whose query, in every layer, is block b0's token 3 as the window first
// held it, scaled up: it asks about b0.
StepView probe_for_b0(const KvSpec& spec, const at::Tensor& raw0) {
  const at::Tensor k03 = apply_rope(raw0, at::arange(0, 6, at::kLong).unsqueeze(1), spec.rope).select(1, 3);
  StepView probe;
  probe.fresh = 2;
  for (int l = 0; l < spec.n_layers; ++l) probe.query.push_back(k03 * 10);
  return probe;
}

// EVOKE on a constructed case: five blocks of 6 tokens for a budget of 20. The oldest leave
// for the bank as the window overflows; a message whose query matches a key of the first block
// brings that block back (re-anchored after everything, K as RoPE at its new positions, V bit
// for bit) with the block before the message, and the rest make room. evoke_discard drops.
TEST(TextPolicy, EvokeBanksTheOldestBlocksAndRestoresTheRelevantOneReanchored) {
  for (const std::string name : {"evoke", "evoke_discard"}) {
    at::manual_seed(9);
    const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
    KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{});
    TextMemoryConfig c = config(name, 20);
    c.reserve = 6;  // room for the last block and one more: 20 - 2 (message) - 6
    c.placement = "tail";
    auto p = make_text_policy(c);
    EXPECT_TRUE(p->block_wise());
    EXPECT_EQ(p->wants_recall(), name == "evoke");
    const std::vector<at::Tensor> raw = feed_blocks(mem, *p, 5);
    // 24 tokens after block 3: b0 leaves; after block 4: b1.
    std::vector<std::string> ids;
    for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
    EXPECT_EQ(ids, (std::vector<std::string>{"b2", "b3", "b4"})) << name;
    EXPECT_EQ(p->evictions(), 2) << name;
    EXPECT_EQ(mem.bank().size(), name == "evoke" ? 2u : 0u) << name;
    if (name != "evoke") continue;
    mem.apply(p->recall(mem, probe_for_b0(spec, raw[0])));
    ids.clear();
    for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
    EXPECT_EQ(ids, (std::vector<std::string>{"b4", "b0"}));
    EXPECT_EQ(p->recoveries(), 1);
    EXPECT_EQ(p->evictions(), 4);  // b2 and b3 made room
    const at::Tensor want_pos = at::arange(30, 36, at::kLong).unsqueeze(1);
    for (int l = 0; l < spec.n_layers; ++l) {
      const at::Tensor k = mem.window().k(l).narrow(1, 6, 6), v = mem.window().v(l).narrow(1, 6, 6);
      EXPECT_TRUE(at::equal(mem.window().pos(l).narrow(0, 6, 6), want_pos)) << l;
      EXPECT_LE((k - apply_rope(raw[0], want_pos, spec.rope)).abs().max().item<double>(), 1e-5) << l;
      EXPECT_TRUE(at::equal(v, raw[0] * 2)) << l;
    }
    EXPECT_EQ(p->next_position(mem.window(), 0), 36);
  }
}

// message_blocks: for a message the window holds at most that many blocks (the block before
// the message, then the most relevant); relevance_margin 0: only the most relevant beside the
// block before the message. The rest go to the bank although they would fit. Five blocks of 6
// tokens, budget 20, nothing reserved: room for three blocks beside the 2-token message; with
// message_blocks 2, or with the margin, only b4 (before the message) and b0 (the one it asks
// about).
TEST(TextPolicy, EvokeMessageBlocksKeepsOnlyTheMostRelevantForAMessage) {
  for (const auto& [message_blocks, margin] : std::vector<std::pair<int64_t, double>>{{0, -1.0}, {2, -1.0}, {0, 0.0}}) {
    at::manual_seed(9);
    const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
    KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{});
    TextMemoryConfig c = config("evoke", 20);
    c.reserve = 0;
    c.placement = "tail";
    c.message_blocks = message_blocks;
    c.relevance_margin = margin;
    auto p = make_text_policy(c);
    const std::vector<at::Tensor> raw = feed_blocks(mem, *p, 5);
    mem.apply(p->recall(mem, probe_for_b0(spec, raw[0])));
    std::vector<std::string> ids;
    for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
    EXPECT_EQ(p->recoveries(), 1) << message_blocks;
    if (message_blocks == 2 || margin >= 0) {
      EXPECT_EQ(ids, (std::vector<std::string>{"b4", "b0"})) << message_blocks << " " << margin;
      EXPECT_EQ(p->evictions(), 4);  // b0, b1 over the budget; b2 and b3 for the message
    } else {
      EXPECT_EQ(ids.size(), 3u);  // what fits: b4, b0 and one of b2, b3
      EXPECT_EQ(p->evictions(), 3);
    }
  }
}

// Placement "compact": every eviction and recall leaves the window's positions 0, 1, ... in the
// order the blocks arrived, keys rotated to match (V untouched), and a restored block lands
// between the blocks around it.
TEST(TextPolicy, EvokeCompactKeepsPositionsDenseInArrivalOrder) {
  at::manual_seed(11);
  const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
  KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{});
  TextMemoryConfig c = config("evoke", 20);
  c.reserve = 6;
  c.placement = "compact";
  auto p = make_text_policy(c);
  std::vector<at::Tensor> raw;
  int64_t next = 0;
  for (int b = 0; b < 5; ++b) {
    raw.push_back(at::randn({spec.n_kv_heads, 6, spec.head_dim}));
    const at::Tensor pos = at::arange(next, next + 6, at::kLong).unsqueeze(1);
    for (int l = 0; l < spec.n_layers; ++l)
      mem.window().append("blocks", "b" + std::to_string(b), l, apply_rope(raw[b], pos, spec.rope), raw[b] * 2, pos);
    mem.apply(p->observe(mem, view({}, 6)));
    next = p->next_position(mem.window(), next + 6);
  }
  // b0 left after block 3, b1 after block 4; what stays moved down to 0..17.
  auto check = [&](const std::vector<int>& blocks) {
    std::vector<std::string> ids;
    for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
    ASSERT_EQ(ids.size(), blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const std::string id = "b" + std::to_string(blocks[i]);
      for (int l = 0; l < spec.n_layers; ++l) {
        const int64_t b = mem.window().layout().segment_begin(l, id);
        const at::Tensor pos = mem.window().pos(l).narrow(0, b, 6);
        const int64_t first = pos[0][0].item<int64_t>();
        // In arrival order, no gaps: the i-th block of the list sits at 6 i.
        EXPECT_EQ(first, 6 * static_cast<int64_t>(i)) << id << " layer " << l;
        EXPECT_TRUE(at::equal(pos, at::arange(first, first + 6, at::kLong).unsqueeze(1))) << id;
        EXPECT_LE((mem.window().k(l).narrow(1, b, 6) - apply_rope(raw[blocks[i]], pos, spec.rope)).abs().max().item<double>(),
                  1e-5)
            << id << " layer " << l;
        EXPECT_TRUE(at::equal(mem.window().v(l).narrow(1, b, 6), raw[blocks[i]] * 2)) << id;
      }
    }
  };
  check({2, 3, 4});
  EXPECT_EQ(next, 18);
  EXPECT_EQ(p->next_position(mem.window(), 1000), 18);  // the window's end, whatever the count says
  // A message whose last query is b0's token 3 as banked (at positions 0..5): b0 comes back
  // before b4 (it arrived first), b2 and b3 make room.
  const at::Tensor k03 = apply_rope(raw[0], at::arange(0, 6, at::kLong).unsqueeze(1), spec.rope).select(1, 3);
  StepView probe;
  probe.fresh = 2;
  for (int l = 0; l < spec.n_layers; ++l) probe.query.push_back(k03 * 10);
  mem.apply(p->recall(mem, probe));
  std::vector<std::string> ids;
  for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"b4", "b0"}));  // region order: b0 was fetched to the end
  // Positions: b0 at 0..5, b4 at 6..11.
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_TRUE(at::equal(mem.window().pos(l).narrow(0, 6, 6), at::arange(0, 6, at::kLong).unsqueeze(1)));
    EXPECT_TRUE(at::equal(mem.window().pos(l).narrow(0, 0, 6), at::arange(6, 12, at::kLong).unsqueeze(1)));
    EXPECT_LE((mem.window().k(l).narrow(1, 6, 6) - apply_rope(raw[0], at::arange(0, 6, at::kLong).unsqueeze(1), spec.rope))
                  .abs().max().item<double>(),
              1e-5);
    EXPECT_LE((mem.window().k(l).narrow(1, 0, 6) - apply_rope(raw[4], at::arange(6, 12, at::kLong).unsqueeze(1), spec.rope))
                  .abs().max().item<double>(),
              1e-5);
  }
  EXPECT_EQ(p->next_position(mem.window(), 0), 12);
  EXPECT_EQ(p->recoveries(), 1);
}

// The core's move: one segment, every layer, re-anchored as one RoPE rotation; an absent segment
// is an error naming it.
TEST(TextPolicy, MoveReanchorsOneSegmentInEveryLayer) {
  Filled f = filled(10);
  const KvSpec& spec = f.memory.spec();
  const at::Tensor raw = at::randn({spec.n_kv_heads, 4, spec.head_dim});
  const at::Tensor pos = at::arange(10, 14, at::kLong).unsqueeze(1);
  for (int l = 0; l < spec.n_layers; ++l)
    f.memory.window().append("blocks", "x", l, apply_rope(raw, pos, spec.rope), raw, pos);
  f.memory.apply(MemoryPlan().move("x", Reanchor{0, -7}));
  for (int l = 0; l < spec.n_layers; ++l) {
    const int64_t b = f.memory.window().layout().segment_begin(l, "x");
    EXPECT_TRUE(at::equal(f.memory.window().pos(l).narrow(0, b, 4), pos - 7));
    EXPECT_LE((f.memory.window().k(l).narrow(1, b, 4) - apply_rope(raw, pos - 7, spec.rope)).abs().max().item<double>(), 1e-5);
    const int64_t r = f.memory.window().layout().segment_begin(l, "recent");  // untouched
    EXPECT_TRUE(at::equal(f.memory.window().pos(l).narrow(0, r, 10), at::arange(10, at::kLong).unsqueeze(1)));
  }
  try {
    f.memory.apply(MemoryPlan().move("nope", Reanchor{0, 1}));
    ADD_FAILURE() << "moving an absent segment must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
}

// Relevance by the model's hidden states or by sentence embeddings: the block whose vector
// matches the message's comes back (here the vectors are one-hot: hidden states by block, and an
// embedder keyed by a text's first token).
TEST(TextPolicy, EvokeRelevanceByHiddenStatesOrEmbeddingsRestoresTheMatchingBlock) {
  for (const std::string relevance : {"hidden", "embedding"}) {
    at::manual_seed(13);
    const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
    KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{});
    TextMemoryConfig c = config("evoke", 20);
    c.reserve = 6;
    c.relevance = relevance;
    int embedded = 0;
    c.embedder = [&embedded](const std::vector<std::vector<int64_t>>& texts) {
      at::Tensor out = at::zeros({static_cast<int64_t>(texts.size()), 8});
      for (size_t i = 0; i < texts.size(); ++i) out[static_cast<int64_t>(i)][texts[i].at(0) % 8] = 1.0;
      embedded += static_cast<int>(texts.size());
      return out;
    };
    auto p = make_text_policy(c);
    EXPECT_EQ(p->step_needs().hidden, relevance == "hidden");
    for (int b = 0; b < 5; ++b) {
      const std::string id = "b" + std::to_string(b);
      const at::Tensor pos = at::arange(6 * b, 6 * b + 6, at::kLong).unsqueeze(1);
      for (int l = 0; l < spec.n_layers; ++l)
        mem.window().append("blocks", id, l, at::randn({spec.n_kv_heads, 6, spec.head_dim}),
                            at::randn({spec.n_kv_heads, 6, spec.head_dim}), pos);
      StepView v = view({}, 6);
      v.segment = id;
      v.tokens = at::full({6}, b, at::kLong);
      v.hidden = at::zeros({6, 5});
      v.hidden.select(1, b).fill_(1.0);
      mem.apply(p->observe(mem, v));
    }
    StepView probe;
    probe.fresh = 2;
    probe.tokens = at::full({2}, 1, at::kLong);  // embeds like b1
    probe.hidden = at::zeros({2, 5});
    probe.hidden.select(1, 1).fill_(1.0);  // b1's hidden states
    for (int l = 0; l < spec.n_layers; ++l) probe.query.push_back(at::zeros({spec.n_kv_heads, spec.head_dim}));
    mem.apply(p->recall(mem, probe));
    std::vector<std::string> ids;
    for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
    EXPECT_EQ(ids, (std::vector<std::string>{"b4", "b1"})) << relevance;
    if (relevance == "embedding") EXPECT_EQ(embedded, 6);  // the message and the 5 blocks, once each
  }
  TextMemoryConfig c = config("evoke", 20);
  c.relevance = "embedding";  // without an embedder
  EXPECT_THROW(make_text_policy(c), Error);
  c.relevance = "nearest";
  EXPECT_THROW(make_text_policy(c), Error);
}

// EVOKE's scorer: the lowest priority leaves first, then the least recently used; pinned blocks,
// the first sink_blocks to arrive and each kind's floor of most recently used blocks never leave.
TEST(TextPolicy, EvokeScorerKeepsPinnedSinksKindFloorsAndHigherPriority) {
  const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
  KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{});
  TextMemoryConfig c = config("evoke", 20);
  c.sink_blocks = 1;
  c.kind_floors = {{"fact", 1}};
  auto p = make_text_policy(c);
  auto meta = [](const std::string& kind, double priority, bool pinned) {
    BlockMeta m;
    m.kind = kind, m.priority = priority, m.pinned = pinned;
    return m;
  };
  const std::vector<BlockMeta> tags = {meta("turn", 0, false), meta("fact", 0, false), meta("turn", 0, true),
                                       meta("fact", 0, false), meta("turn", 1, false), meta("turn", 0, false),
                                       meta("turn", 0, false)};
  for (int b = 0; b < 7; ++b) {
    const std::string id = "b" + std::to_string(b);
    mem.apply(MemoryPlan().tag(id, tags[b], "blocks"));  // made empty, tagged, before its tokens
    const at::Tensor pos = at::arange(4 * b, 4 * b + 4, at::kLong).unsqueeze(1);
    for (int l = 0; l < spec.n_layers; ++l)
      mem.window().append("blocks", id, l, at::randn({spec.n_kv_heads, 4, spec.head_dim}),
                          at::randn({spec.n_kv_heads, 4, spec.head_dim}), pos);
    EXPECT_EQ(mem.window().meta(id).kind, tags[b].kind);
    mem.apply(p->observe(mem, view({}, 4)));
  }
  // b5 over the budget: b1 leaves (a fact beyond its kind's floor, b3 being the more recent);
  // b4 (priority 1) stays. b6: b5 leaves (priority 0) before b4.
  std::vector<std::string> ids;
  for (const auto& seg : mem.window().layout().segments(mem.window().layout().region("blocks"))) ids.push_back(seg.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"b0", "b2", "b3", "b4", "b6"}));
  EXPECT_EQ(mem.window().size(0), 20);
  EXPECT_THROW(mem.apply(MemoryPlan().tag("nope", BlockMeta{})), Error);  // absent, no region to make it in
}

// Recovery "breadcrumb": an evicted block is gone from window and bank, and a stub stands for
// it, once; a stub that leaves in its turn leaves none.
TEST(TextPolicy, EvokeBreadcrumbLeavesAStubForAnEvictedBlock) {
  const KvSpec spec = test::random_model(kVocab, 1)->kv_spec(at::kCPU);
  KvMemory mem(spec, {"system", "blocks", "recent"}, StoreConfig{});
  auto p = make_text_policy(config("evoke_breadcrumb", 20));
  EXPECT_FALSE(p->wants_recall());
  auto add = [&](const std::string& id, int64_t first, int64_t n) {
    const at::Tensor pos = at::arange(first, first + n, at::kLong).unsqueeze(1);
    for (int l = 0; l < spec.n_layers; ++l)
      mem.window().append("blocks", id, l, at::randn({spec.n_kv_heads, n, spec.head_dim}),
                          at::randn({spec.n_kv_heads, n, spec.head_dim}), pos);
    mem.apply(p->observe(mem, view({}, n)));
  };
  for (int b = 0; b < 4; ++b) add("b" + std::to_string(b), 6 * b, 6);
  EXPECT_EQ(mem.window().layout().find("b0").first, -1);
  EXPECT_EQ(mem.bank().size(), 0u);
  const auto crumbs = p->take_breadcrumbs();
  ASSERT_EQ(crumbs.size(), 1u);
  EXPECT_EQ(crumbs[0].first, "crumb:b0");
  EXPECT_NE(crumbs[0].second.find("b0"), std::string::npos);
  EXPECT_TRUE(p->take_breadcrumbs().empty());  // handed over once
  add("crumb:b0", 24, 3);  // 21 tokens: b1 leaves (the oldest), a crumb for it
  add("b4", 27, 6);        // 20 + 6: crumb:b0 and b2 leave; only b2 gets a crumb
  std::vector<std::string> got;
  for (const auto& c : p->take_breadcrumbs()) got.push_back(c.first);
  EXPECT_EQ(got, (std::vector<std::string>{"crumb:b1", "crumb:b2"}));
}

Tokenizer fixture_tokenizer() {
  return Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json");
}

// End to end through the session: each policy keeps the window within its budget after every
// step, and the full policy's predictions are those of a budget no context reaches.
TEST(TextPolicy, SessionKeepsEveryPolicyWithinBudget) {
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = test::random_model(tok.vocab_size(), 5);
  std::vector<int64_t> ids;
  for (int i = 0; i < 12; ++i) {
    auto part = tok.encode("Recall fada: 3117 and piti: 42\n");
    ids.insert(ids.end(), part.begin(), part.end());
  }
  ASSERT_GT(ids.size(), 100u);
  const int64_t prefill = static_cast<int64_t>(ids.size()) - 20;
  SessionOptions base;
  base.prefill_chunk = 32;
  LlmSession full(m, tok, at::kCPU, at::kFloat, base);
  const std::vector<int64_t> want = full.predict(ids, {prefill});
  ASSERT_EQ(want.size(), ids.size());
  for (const auto& name : text_policy_names()) {
    SessionOptions so = base;
    so.memory = config(name, name == "full" ? 0 : 40);
    so.memory.window = 8;
    LlmSession s(m, tok, at::kCPU, at::kFloat, so);
    // Block-wise policies get the context as blocks of 10 tokens, the last 20 one per step in a
    // block of their own, the last of them a message.
    std::vector<PromptPiece> pieces;
    for (int64_t e = 10; e < prefill; e += 10) pieces.push_back({e, "b" + std::to_string(e / 10), false, false});
    pieces.push_back({prefill, "last", false, false});
    pieces.push_back({static_cast<int64_t>(ids.size()) - 5, "tail", true, true});
    pieces.push_back({static_cast<int64_t>(ids.size()), "answer", false, true});
    const bool blocks = s.policy().block_wise();
    auto run = [&] { return blocks ? s.predict_pieces(ids, pieces) : s.predict(ids, {prefill}); };
    const std::vector<int64_t> got = run();
    ASSERT_EQ(got.size(), ids.size()) << name;
    if (name == "full") {
      EXPECT_EQ(got, want);
      EXPECT_EQ(s.window().size(0), static_cast<int64_t>(ids.size()));
      continue;
    }
    // Until the first eviction every policy predicts as the full cache does.
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + 32, want.begin())) << name;
    // The budget holds over the layers (pyramidkv's differ per layer); snapkv, pyramidkv and
    // adakv keep the 20 decoded tokens on top. Per-head selections hold it per kv head (adakv's
    // over the heads of a layer together); the window holds the union of the heads' tokens.
    const bool snap_head = name == "snapkv" || name == "pyramidkv" || name == "adakv";
    const bool per_head = snap_head || name == "keepkv" || name == "keepkv_ev";
    const bool snap = snap_head || name == "snapkv_layer" || name == "pyramidkv_layer";
    const int64_t per_head_seen = snap_head ? 40 + 20 : 40;
    const int L = m->config().num_hidden_layers;
    const int64_t KH = m->config().num_key_value_heads;
    int64_t total = 0;
    for (int l = 0; l < L; ++l) total += s.window().size(l);
    if (per_head) {
      int64_t seen = 0;
      for (int l = 0; l < L; ++l)
        for (int64_t h = 0; h < KH; ++h) seen += s.window().visible(l, h);
      EXPECT_EQ(seen, KH * L * per_head_seen) << name;
      EXPECT_GE(total, L * per_head_seen) << name;
      EXPECT_LE(total, L * (KH * 40 + 20)) << name;
    } else if (blocks) {  // whole blocks leave: at most the budget
      EXPECT_LE(total, L * 40) << name;
      EXPECT_LE(s.peak_tokens(), 40) << name;
      EXPECT_GT(s.policy().evictions(), 0) << name;
    } else {
      EXPECT_EQ(total, L * (snap ? 40 + 20 : 40)) << name;
      EXPECT_EQ(s.peak_tokens(), snap ? 60 : 40) << name;
      EXPECT_EQ(s.tokens_per_layer(), snap ? 60 : 40) << name;
    }
    s.reset();
    EXPECT_EQ(run(), got) << name << ": a reset session repeats itself";
  }
}

// keep_log_probs(): the log-probabilities after chosen tokens, their argmax predict()'s own
// prediction there, normalised; the request is gone after take_log_probs().
TEST(TextPolicy, LogProbsAfterChosenTokensMatchThePredictions) {
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = test::random_model(tok.vocab_size(), 5);
  const std::vector<int64_t> ids = tok.encode("Recall fada: 3117 and piti: 42\nRecall fada:");
  SessionOptions so;
  so.prefill_chunk = 4;
  LlmSession s(m, tok, at::kCPU, at::kFloat, so);
  s.keep_log_probs({10, 2, static_cast<int64_t>(ids.size()) - 1});
  const std::vector<int64_t> arg = s.predict(ids, {static_cast<int64_t>(ids.size()) - 3});
  const std::vector<at::Tensor> lp = s.take_log_probs();
  ASSERT_EQ(lp.size(), 3u);
  const std::vector<int64_t> at_idx = {10, 2, static_cast<int64_t>(ids.size()) - 1};
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(lp[k].defined()) << k;
    EXPECT_EQ(lp[k].argmax().item<int64_t>(), arg[at_idx[k]]) << k;
    EXPECT_NEAR(lp[k].exp().sum().item<double>(), 1.0, 1e-5) << k;
  }
  s.reset();
  s.predict(ids, {static_cast<int64_t>(ids.size())});
  EXPECT_TRUE(s.take_log_probs().empty());
  s.keep_log_probs({static_cast<int64_t>(ids.size())});
  EXPECT_THROW(s.predict(ids, {static_cast<int64_t>(ids.size())}), Error);  // past the ids
}

}  // namespace text_policy_test
}  // namespace wm::llm
