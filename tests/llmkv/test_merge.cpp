// KeepKV's merging: ZIP-merging leaves the attention output for its query unchanged; votes-only
// merging and plain averaging do not.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "llmkv/merge.h"
#include "runtime/attention.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

// Attention of q [KH, d] (one query per kv head) over k, v [KH, n, d] with log-weights [n], as
// the core computes it: [KH, d].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw) {
  AttentionOptions ao;
  ao.mask.kind = AttentionMask::None;
  ao.n_window = k.size(1);
  return attention(q.unsqueeze(1), k, v, logw, ao).out.squeeze(1);
}

struct Entries {
  at::Tensor k, v, logw, q;
};

// n entries of KH heads x d, votes log p with p drawn from `votes` (1 each: fresh tokens).
Entries random_entries(int64_t KH, int64_t n, int64_t d, const std::vector<double>& votes, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  Entries e;
  e.k = at::randn({KH, n, d}, g, at::kDouble, at::kStrided, at::kCPU, false).to(at::kFloat);
  e.v = at::randn({KH, n, d}, g, at::kDouble, at::kStrided, at::kCPU, false).to(at::kFloat);
  e.q = at::randn({KH, d}, g, at::kDouble, at::kStrided, at::kCPU, false).to(at::kFloat);
  std::vector<float> lw(n);
  for (int64_t i = 0; i < n; ++i) lw[i] = static_cast<float>(std::log(votes[i % votes.size()]));
  e.logw = at::tensor(lw);
  return e;
}

// The window after entries i and j (i < j) merge: j's slot gone, i's replaced.
at::Tensor merged_output(const Entries& e, int64_t i, int64_t j, MergeRule rule) {
  const int64_t n = e.k.size(1);
  std::vector<int64_t> group(n);
  for (int64_t t = 0, g = 0; t < n; ++t) group[t] = t == j ? group[i] : g++;
  const MergedKv m = merge_groups(e.k, e.v, e.logw, group, n - 1, e.q, 1.0 / std::sqrt(e.k.size(2)), rule);
  return attend(e.q, m.k, m.v, m.logw);
}

TEST(Merge, ZipMergingLeavesTheAttentionOutputUnchanged) {
  const std::vector<std::vector<double>> vote_sets = {{1.0}, {1.0, 3.0, 7.0}, {2.0, 0.5}, {40.0, 1.0, 1.0, 12.0}};
  double zip_worst = 0, votes_best = 1e9, avg_best = 1e9;
  int cases = 0;
  for (size_t vs = 0; vs < vote_sets.size(); ++vs)
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const Entries e = random_entries(2, 12, 16, vote_sets[vs], 100 * vs + seed);
      const at::Tensor before = attend(e.q, e.k, e.v, e.logw);
      for (auto [i, j] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {3, 9}, {2, 11}, {7, 8}}) {
        const double zip = (merged_output(e, i, j, MergeRule::Zip) - before).abs().max().item<double>();
        const double votes = (merged_output(e, i, j, MergeRule::Votes) - before).abs().max().item<double>();
        const double avg = (merged_output(e, i, j, MergeRule::Average) - before).abs().max().item<double>();
        EXPECT_LE(zip, 1e-5) << "votes set " << vs << " seed " << seed << " merge " << i << "," << j;
        EXPECT_GT(votes, 1e-3) << "votes set " << vs << " seed " << seed << " merge " << i << "," << j;
        EXPECT_GT(avg, 1e-3) << "votes set " << vs << " seed " << seed << " merge " << i << "," << j;
        zip_worst = std::max(zip_worst, zip);
        votes_best = std::min(votes_best, votes);
        avg_best = std::min(avg_best, avg);
        ++cases;
      }
    }
  std::printf("  %d merges: zip worst %.2e, votes-only best %.2e, averaging best %.2e\n", cases, zip_worst, votes_best,
              avg_best);
}

TEST(Merge, ManyIntoOneIsExactAndSingletonsPassThroughBitForBit) {
  const Entries e = random_entries(3, 10, 8, {1.0, 2.0, 5.0}, 7);
  // Entries 0, 4, 5 and 9 into group 0; the rest alone.
  const std::vector<int64_t> group = {0, 1, 2, 3, 0, 0, 4, 5, 6, 0};
  const MergedKv m = merge_groups(e.k, e.v, e.logw, group, 7, e.q, 1.0 / std::sqrt(8.0), MergeRule::Zip);
  EXPECT_LE((attend(e.q, m.k, m.v, m.logw) - attend(e.q, e.k, e.v, e.logw)).abs().max().item<double>(), 1e-5);
  // The merged entry holds the four entries' votes (1, 2, 5, 1: entry i has vote {1, 2, 5}[i % 3]).
  EXPECT_NEAR(m.logw[0].item<double>(), std::log(9.0), 1e-6);
  const std::vector<std::pair<int64_t, int64_t>> alone = {{1, 1}, {2, 2}, {3, 3}, {4, 6}, {5, 7}, {6, 8}};
  for (auto [g, i] : alone) {
    EXPECT_TRUE(at::equal(m.k.select(1, g), e.k.select(1, i))) << g;
    EXPECT_TRUE(at::equal(m.v.select(1, g), e.v.select(1, i))) << g;
    EXPECT_EQ(m.logw[g].item<float>(), e.logw[i].item<float>()) << g;
  }
  // Votes: the merged key is the vote-weighted mean of the members.
  const MergedKv mv = merge_groups(e.k, e.v, e.logw, group, 7, e.q, 1.0 / std::sqrt(8.0), MergeRule::Votes);
  const at::Tensor want = (e.k.select(1, 0) * 1 + e.k.select(1, 4) * 2 + e.k.select(1, 5) * 5 + e.k.select(1, 9)) / 9;
  EXPECT_LE((mv.k.select(1, 0) - want).abs().max().item<double>(), 1e-6);
}

TEST(Merge, BadGroupsAreErrors) {
  const Entries e = random_entries(1, 4, 4, {1.0}, 3);
  EXPECT_THROW(merge_groups(e.k, e.v, e.logw, {0, 1, 2}, 3, e.q, 0.5, MergeRule::Zip), Error);      // one short
  EXPECT_THROW(merge_groups(e.k, e.v, e.logw, {0, 1, 2, 5}, 3, e.q, 0.5, MergeRule::Zip), Error);   // out of range
  EXPECT_THROW(merge_groups(e.k, e.v, e.logw, {0, 0, 2, 2}, 3, e.q, 0.5, MergeRule::Zip), Error);   // group 1 empty
  EXPECT_THROW(merge_groups(e.k, e.v, e.logw, {0, 1, 2, 2}, 3, e.q.narrow(1, 0, 2), 0.5, MergeRule::Zip), Error);
}

}  // namespace
}  // namespace wm::llm
