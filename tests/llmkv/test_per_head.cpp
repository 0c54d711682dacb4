// Per-head KV selection: the window's per-head token sets (KvWindow::keep_tokens_per_head), the
// attention over them against a dense attention with the dropped keys masked, and SnapKV /
// AdaKV choosing per kv head on constructed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "llm_test_util.h"
#include "llmkv/model.h"
#include "llmkv/text_policy.h"
#include "runtime/error.h"
#include "runtime/attention.h"
#include "runtime/memory.h"

namespace wm::llm {
namespace {

constexpr int64_t kVocab = 61;

KvSpec small_spec() { return test::random_model(kVocab, 1)->kv_spec(at::kCPU); }

// n tokens at positions 0..n-1 in every layer of a window of the small model's layout.
KvWindow window_of(const KvSpec& spec, const at::Tensor& k, const at::Tensor& v) {
  KvWindow w(spec, {"system", "blocks", "recent"});
  const at::Tensor pos = at::arange(k.size(1), at::kLong).unsqueeze(1);
  for (int l = 0; l < spec.n_layers; ++l) w.append("recent", "recent", l, k, v, pos);
  return w;
}

std::vector<int64_t> range_from(int64_t a, int64_t b) {
  std::vector<int64_t> v(b - a);
  std::iota(v.begin(), v.end(), a);
  return v;
}
std::vector<int64_t> range_of(int64_t n) { return range_from(0, n); }

std::vector<int64_t> positions(const KvWindow& w, int l) {
  const at::Tensor p = w.pos(l).select(1, 0).contiguous();
  return std::vector<int64_t>(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
}

// The tokens kv head h of layer l sees, by position.
std::vector<int64_t> seen_by(const KvWindow& w, int l, int64_t h) {
  const std::vector<int64_t> pos = positions(w, l);
  const at::Tensor hl = w.head_logw(l);
  std::vector<int64_t> out;
  for (size_t j = 0; j < pos.size(); ++j)
    if (!hl.defined() || hl[h][static_cast<int64_t>(j)].item<float>() == 0.f) out.push_back(pos[j]);
  return out;
}

TEST(PerHeadWindow, KeepsTheUnionAndHidesFromEachHeadWhatItDropped) {
  const KvSpec spec = small_spec();
  const int64_t KH = spec.n_kv_heads;
  ASSERT_GE(KH, 2);
  KvWindow w = window_of(spec, at::randn({KH, 10, spec.head_dim}), at::randn({KH, 10, spec.head_dim}));
  EXPECT_FALSE(w.head_logw(0).defined());
  // Head h keeps token h, 6 and 9.
  std::vector<std::vector<int64_t>> keep(KH);
  for (int64_t h = 0; h < KH; ++h) keep[h] = {h, 6, 9};
  w.keep_tokens_per_head(0, keep);
  std::vector<int64_t> uni = range_of(KH);
  uni.push_back(6);
  uni.push_back(9);
  EXPECT_EQ(positions(w, 0), uni);
  EXPECT_EQ(w.size(1), 10);  // other layers untouched
  EXPECT_FALSE(w.head_logw(1).defined());
  for (int64_t h = 0; h < KH; ++h) {
    EXPECT_EQ(seen_by(w, 0, h), (std::vector<int64_t>{h, 6, 9}));
    EXPECT_EQ(w.visible(0, h), 3);
  }
  const at::Tensor hl = w.head_logw(0);
  ASSERT_EQ(hl.sizes(), (at::IntArrayRef{KH, KH + 2}));
  EXPECT_EQ(hl[0][1].item<float>(), kHiddenLogw);
  // A token appended later is seen by every head; a per-layer keep carries the hiding along.
  w.append("recent", "recent", 0, at::randn({KH, 1, spec.head_dim}), at::randn({KH, 1, spec.head_dim}),
           at::full({1, 1}, 10, at::kLong));
  for (int64_t h = 0; h < KH; ++h) EXPECT_EQ(w.visible(0, h), 4);
  std::vector<int64_t> drop_first = range_of(KH + 3);
  drop_first.erase(drop_first.begin());
  w.keep_tokens(0, drop_first);
  EXPECT_EQ(seen_by(w, 0, 0), (std::vector<int64_t>{6, 9, 10}));
  EXPECT_EQ(seen_by(w, 0, 1), (std::vector<int64_t>{1, 6, 9, 10}));
  // A token a head no longer sees stays unseen even when it lists it again.
  std::vector<std::vector<int64_t>> all(KH, range_of(w.size(0)));
  w.keep_tokens_per_head(0, all);
  EXPECT_EQ(seen_by(w, 0, 0), (std::vector<int64_t>{6, 9, 10}));
  // A block cannot carry per-head hiding: extracting the segment fails, naming it.
  try {
    (void)w.extract("recent");
    ADD_FAILURE() << "extract of a per-head segment did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'recent'"), std::string::npos) << e.what();
  }
  // Bad lists are refused and change nothing.
  const int64_t n = w.size(0);
  EXPECT_THROW(w.keep_tokens_per_head(0, {{0}}), Error);
  std::vector<std::vector<int64_t>> backwards(KH, {2, 1});
  EXPECT_THROW(w.keep_tokens_per_head(0, backwards), Error);
  std::vector<std::vector<int64_t>> outside(KH, {n});
  EXPECT_THROW(w.keep_tokens_per_head(0, outside), Error);
  EXPECT_EQ(w.size(0), n);
  w.clear();
  EXPECT_FALSE(w.head_logw(0).defined());
}

// Softmax attention in double over the full keys (window then current), key j of the window
// hidden from kv head h unless listed in keep[h], current keys causal: out [H, c, d], mass
// [KH, n + c].
std::pair<at::Tensor, at::Tensor> dense_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const std::vector<std::set<int64_t>>& keep) {
  const int64_t H = q.size(0), c = q.size(1), d = q.size(2), KH = k.size(0), nk = k.size(1), n = nk - c,
                G = H / KH;
  at::Tensor out = at::zeros({H, c, d}, at::kDouble), mass = at::zeros({KH, nk}, at::kDouble);
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  for (int64_t hq = 0; hq < H; ++hq) {
    const int64_t h = hq / G;
    at::Tensor s = at::matmul(qd[hq], kd[h].t()) / std::sqrt(static_cast<double>(d));  // [c, nk]
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < nk; ++j) {
        const bool hidden = j < n ? keep[h].count(j) == 0 : (j - n) > i;
        if (hidden) s[i][j] = -std::numeric_limits<double>::infinity();
      }
    const at::Tensor p = at::softmax(s, 1);
    out[hq] = at::matmul(p, vd[h]);
    mass[h] += p.sum(0);
  }
  return {out, mass};
}

// The attention over a per-head window equals a dense attention with each head's dropped keys
// masked (1e-6), for a decoded token (the decode kernels) and a prefill chunk (wm::attention);
// a key a head does not see receives exactly no mass from it.
TEST(PerHeadWindow, AttentionEqualsDenseAttentionWithTheDroppedKeysMasked) {
  const KvSpec spec = small_spec();
  const int64_t KH = spec.n_kv_heads, d = spec.head_dim, H = 2 * KH, n = 24;
  at::manual_seed(7);
  const at::Tensor K = at::randn({KH, n, d}), V = at::randn({KH, n, d});
  std::vector<std::vector<int64_t>> keep(KH);
  std::vector<std::set<int64_t>> keep_set(KH);
  for (int64_t h = 0; h < KH; ++h)
    for (int64_t j = 0; j < n; ++j)
      if ((j * (h + 3) + h) % 4 != 0 && (j + h) % 5 != 0) keep[h].push_back(j), keep_set[h].insert(j);
  for (int64_t c : {1, 5}) {
    KvWindow w = window_of(spec, K, V);
    w.keep_tokens_per_head(0, keep);
    std::vector<int64_t> uni = positions(w, 0);
    const at::Tensor q = at::randn({H, c, d}), kc = at::randn({KH, c, d}), vc = at::randn({KH, c, d});
    const KvWindow::Staged st = w.stage(0, kc, vc);
    ASSERT_TRUE(st.head_logw.defined());
    AttentionOptions ao;
    ao.mask.kind = AttentionMask::Causal;
    ao.n_window = st.n_window;
    ao.capture_mass = true;
    const AttentionResult got = attend_per_head(q, st, ao, c == 1);
    auto [want, want_mass] = dense_reference(q, at::cat({K, kc}, 1), at::cat({V, vc}, 1), keep_set);
    EXPECT_LT((got.out.to(at::kDouble) - want).abs().max().item<double>(), 1e-6) << c << " current tokens";
    // Mass: the window's union columns, then the current tokens.
    std::vector<int64_t> cols = uni;
    for (int64_t i = 0; i < c; ++i) cols.push_back(n + i);
    const at::Tensor want_cols = want_mass.index_select(1, at::tensor(cols, at::kLong));
    ASSERT_EQ(got.key_mass.sizes(), want_cols.sizes());
    EXPECT_LT((got.key_mass.to(at::kDouble) - want_cols).abs().max().item<double>(), 1e-6) << c;
    for (int64_t h = 0; h < KH; ++h)
      for (size_t j = 0; j < uni.size(); ++j)
        if (!keep_set[h].count(uni[j])) EXPECT_EQ(got.key_mass[h][static_cast<int64_t>(j)].item<float>(), 0.f);
  }
}

TextMemoryConfig config(const std::string& policy, int64_t budget) {
  TextMemoryConfig c;
  c.policy = policy;
  c.budget = budget;
  c.window = 8;
  c.kernel = 1;
  return c;
}

StepView view(std::vector<at::Tensor> key_mass, int64_t fresh) {
  StepView v;
  v.fresh = fresh;
  v.key_mass = std::move(key_mass);
  return v;
}

// Two heads that want different tokens: kv head 0 votes for tokens 10-14, head 1 for 30-34 (less
// strongly), budget 10 (5 observation tokens 59-63 and 5 by votes). Per head, each keeps its own
// target; pooled over the heads, the layer keeps head 0's and head 1 loses its target.
TEST(PerHeadSelection, EachHeadKeepsItsTargetWherePooledVotesCannot) {
  const KvSpec spec = small_spec();
  const int64_t KH = spec.n_kv_heads, n = 64;
  const int L = spec.n_layers;
  std::vector<at::Tensor> mass;
  for (int l = 0; l < L; ++l) {
    at::Tensor m = at::full({KH, n}, 0.01);
    m[0].narrow(0, 10, 5).fill_(3.0);
    for (int64_t h = 1; h < KH; ++h) m[h].narrow(0, 30, 5).fill_(2.0);
    mass.push_back(m);
  }
  const std::vector<int64_t> obs = range_from(59, 64);
  auto with = [](std::vector<int64_t> a, const std::vector<int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  for (const std::string name : {"snapkv", "snapkv_layer"}) {
    KvMemory memory(spec, {"system", "blocks", "recent"}, StoreConfig{});
    const at::Tensor pos = at::arange(n, at::kLong).unsqueeze(1);
    for (int l = 0; l < L; ++l)
      memory.window().append("recent", "recent", l, at::randn({KH, n, spec.head_dim}),
                             at::randn({KH, n, spec.head_dim}), pos);
    auto p = make_text_policy(config(name, 10));
    memory.apply(p->observe(memory, view(mass, n)));
    for (int l = 0; l < L; ++l) {
      EXPECT_EQ(seen_by(memory.window(), l, 0), with(range_from(10, 15), obs)) << name;
      if (name == "snapkv") {
        for (int64_t h = 1; h < KH; ++h) EXPECT_EQ(seen_by(memory.window(), l, h), with(range_from(30, 35), obs));
        EXPECT_EQ(memory.window().size(l), 15);  // the union
      } else {
        for (int64_t h = 1; h < KH; ++h) EXPECT_EQ(seen_by(memory.window(), l, h), with(range_from(10, 15), obs));
        EXPECT_EQ(memory.window().size(l), 10);
      }
    }
  }
}

// AdaKV: head 0's attention is concentrated on 2 tokens, head 1's spread over 20. With budget 10
// (5 observation tokens, 5 a head on an even split, 10 for the layer's heads) and floor 0.2 (at
// least 1 a head), head 0 keeps its 2 tokens and head 1 the other 8 of the layer's 10.
TEST(PerHeadSelection, AdaKvGivesTheBudgetToTheHeadWhoseAttentionIsSpread) {
  const KvSpec spec = small_spec();
  const int64_t KH = spec.n_kv_heads, n = 64;
  ASSERT_EQ(KH, 2);
  const int L = spec.n_layers;
  std::vector<at::Tensor> mass;
  for (int l = 0; l < L; ++l) {
    at::Tensor m = at::full({KH, n}, 0.001);
    m[0][10] = 5.0;
    m[0][11] = 4.0;
    m[1].narrow(0, 20, 20).fill_(1.0);
    mass.push_back(m);
  }
  KvMemory memory(spec, {"system", "blocks", "recent"}, StoreConfig{});
  const at::Tensor pos = at::arange(n, at::kLong).unsqueeze(1);
  for (int l = 0; l < L; ++l)
    memory.window().append("recent", "recent", l, at::randn({KH, n, spec.head_dim}), at::randn({KH, n, spec.head_dim}),
                           pos);
  auto p = make_text_policy(config("adakv", 10));
  memory.apply(p->observe(memory, view(mass, n)));
  std::vector<int64_t> h0{10, 11}, h1 = range_from(20, 28);
  for (int64_t i = 59; i < 64; ++i) h0.push_back(i), h1.push_back(i);
  for (int l = 0; l < L; ++l) {
    EXPECT_EQ(seen_by(memory.window(), l, 0), h0);
    EXPECT_EQ(seen_by(memory.window(), l, 1), h1);
  }
  // With floor 1 the split is even, as snapkv's.
  TextMemoryConfig even = config("adakv", 10);
  even.adakv_floor = 1.0;
  KvMemory m2(spec, {"system", "blocks", "recent"}, StoreConfig{});
  for (int l = 0; l < L; ++l)
    m2.window().append("recent", "recent", l, at::randn({KH, n, spec.head_dim}), at::randn({KH, n, spec.head_dim}),
                       pos);
  m2.apply(make_text_policy(even)->observe(m2, view(mass, n)));
  for (int64_t h = 0; h < KH; ++h) EXPECT_EQ(m2.window().visible(0, h), 10);
  TextMemoryConfig bad = config("adakv", 10);
  bad.adakv_floor = 1.5;
  EXPECT_THROW(make_text_policy(bad), Error);
}

// KeepKV per kv head: head 0 attends little to tokens 3, 4, 6, 9 and head 1 to 2, 5, 7, 8 (12
// tokens, budget 8, recent 2). Each head merges its own four into its own nearest kept key: the
// heads see different tokens (the window holds all 12), each head's votes still count 12, and
// for the step's query of each head the attention output over what it sees is unchanged (ZIP,
// 1e-5); keepkv_ev, the same choices, moves it.
TEST(PerHeadSelection, KeepKvMergesEachHeadsLeastAttendedLosslesslyForItsQuery) {
  const KvSpec spec = small_spec();
  const int64_t KH = spec.n_kv_heads, n = 12, d = spec.head_dim;
  ASSERT_EQ(KH, 2);
  const int L = spec.n_layers;
  for (const std::string name : {"keepkv", "keepkv_ev"}) {
    at::manual_seed(11);
    KvMemory memory(spec, {"system", "blocks", "recent"}, StoreConfig{});
    const at::Tensor pos = at::arange(n, at::kLong).unsqueeze(1);
    for (int l = 0; l < L; ++l)
      memory.window().append("recent", "recent", l, at::randn({KH, n, d}), at::randn({KH, n, d}), pos);
    StepView v;
    v.fresh = n;
    for (int l = 0; l < L; ++l) {
      at::Tensor m = at::full({KH, n}, 1.0);
      for (int64_t i : {3, 4, 6, 9}) m[0][i] = 0.01;
      for (int64_t i : {2, 5, 7, 8}) m[1][i] = 0.01;
      v.key_mass.push_back(m);
      v.query.push_back(at::randn({KH, d}));
    }
    // Head h's attention for the step's query over what it sees.
    auto attend = [&](int l, int64_t h) {
      const KvWindow& w = memory.window();
      at::Tensor lw = w.logw(l).clone();
      if (w.head_logw(l).defined()) lw += w.head_logw(l)[h];
      AttentionOptions ao;
      ao.n_window = w.size(l);
      return attention(v.query[l].narrow(0, h, 1).unsqueeze(1), w.k(l).narrow(0, h, 1), w.v(l).narrow(0, h, 1), lw,
                       ao)
          .out;
    };
    std::vector<at::Tensor> before;
    for (int l = 0; l < L; ++l)
      for (int64_t h = 0; h < KH; ++h) before.push_back(attend(l, h));
    TextMemoryConfig c;
    c.policy = name;
    c.budget = 8;
    c.recent = 2;
    c.score_kernel = 1;
    memory.apply(make_text_policy(c)->observe(memory, v));
    for (int l = 0; l < L; ++l) {
      const KvWindow& w = memory.window();
      EXPECT_EQ(w.size(l), n) << name;  // the union
      std::vector<int64_t> h0, h1;
      for (int64_t i = 0; i < n; ++i) {
        if (i != 3 && i != 4 && i != 6 && i != 9) h0.push_back(i);
        if (i != 2 && i != 5 && i != 7 && i != 8) h1.push_back(i);
      }
      EXPECT_EQ(w.visible(l, 0), 8);
      EXPECT_EQ(w.visible(l, 1), 8);
      const at::Tensor total = w.logw(l).unsqueeze(0) + w.head_logw(l);
      for (int64_t h = 0; h < KH; ++h) {
        const std::vector<int64_t>& want = h == 0 ? h0 : h1;
        for (int64_t i : want) EXPECT_GT(total[h][i].item<float>(), kHiddenLogw / 2) << name << " head " << h;
        EXPECT_NEAR(total[h].exp().sum().item<double>(), 12.0, 1e-4) << name << " head " << h;
        const double diff = (attend(l, h) - before[l * KH + h]).abs().max().item<double>();
        if (name == "keepkv")
          EXPECT_LE(diff, 1e-5) << "layer " << l << " head " << h;
        else
          EXPECT_GT(diff, 1e-3) << "layer " << l << " head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace wm::llm
