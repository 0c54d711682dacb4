#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "runtime/attention.h"

namespace wm {
namespace {

// Plain reference: repeat kv heads, explicit softmax in float64.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias) {
  const int64_t G = q.size(0) / k.size(0);
  at::Tensor kk = k.to(at::kDouble).repeat_interleave(G, 0), vv = v.to(at::kDouble).repeat_interleave(G, 0);
  at::Tensor s = at::matmul(q.to(at::kDouble), kk.transpose(1, 2)) / std::sqrt(static_cast<double>(q.size(2)));
  s = s + bias.to(at::kDouble);
  return at::matmul(at::softmax(s, -1), vv);
}

TEST(Attention, MatchesReferenceWithGqaAndLogWeights) {
  at::manual_seed(0);
  at::Tensor q = at::randn({8, 5, 16}), k = at::randn({2, 12, 16}), v = at::randn({2, 12, 16});
  at::Tensor logw = at::randn({12}) * 0.5;
  AttentionOptions opt;
  auto r = attention(q, k, v, logw, opt);
  at::Tensor ref = reference(q, k, v, logw.unsqueeze(0).expand({5, 12}));
  EXPECT_LT((r.out.to(at::kDouble) - ref).abs().max().item<double>(), 1e-5);
}

TEST(Attention, LogWeightEqualsIdenticalCopies) {
  at::manual_seed(1);
  const int p = 5;
  at::Tensor q = at::randn({4, 3, 32}), k = at::randn({2, 6, 32}), v = at::randn({2, 6, 32});
  // Merged form: key 2 carries log p.
  at::Tensor logw = at::zeros({6});
  logw[2] = std::log(static_cast<double>(p));
  auto merged = attention(q, k, v, logw);
  // Expanded form: key 2 appears p times.
  std::vector<at::Tensor> ks, vs;
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < (i == 2 ? p : 1); ++c) {
      ks.push_back(k.narrow(1, i, 1));
      vs.push_back(v.narrow(1, i, 1));
    }
  auto copies = attention(q, at::cat(ks, 1), at::cat(vs, 1), at::Tensor());
  EXPECT_LT((merged.out - copies.out).abs().max().item<float>(), 1e-5);
}

TEST(Attention, BlockCausalHidesLaterChunks) {
  at::manual_seed(2);
  const int64_t nw = 7, block = 3, nc = 9;
  at::Tensor q = at::randn({2, nc, 8}), k = at::randn({1, nw + nc, 8}), v = at::randn({1, nw + nc, 8});
  AttentionOptions opt;
  opt.n_window = nw;
  opt.mask.kind = AttentionMask::BlockCausal;
  opt.mask.block = block;
  auto a = attention(q, k, v, at::Tensor(), opt);
  // Change the last chunk's keys and values: the first two chunks' outputs must not move.
  at::Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(1, nw + 6, 3).normal_();
  v2.narrow(1, nw + 6, 3).normal_();
  auto b = attention(q, k2, v2, at::Tensor(), opt);
  EXPECT_TRUE(a.out.narrow(1, 0, 6).equal(b.out.narrow(1, 0, 6)));
  EXPECT_FALSE(a.out.narrow(1, 6, 3).equal(b.out.narrow(1, 6, 3)));
  // Within a chunk every token sees the whole chunk: token 0 moves if token 2 moves.
  at::Tensor k3 = k.clone();
  k3.narrow(1, nw + 2, 1).normal_();
  auto c = attention(q, k3, v, at::Tensor(), opt);
  EXPECT_FALSE(a.out.narrow(1, 0, 1).equal(c.out.narrow(1, 0, 1)));
}

TEST(Attention, CausalMatchesReference) {
  at::manual_seed(3);
  const int64_t nw = 4, nc = 5;
  at::Tensor q = at::randn({2, nc, 8}), k = at::randn({2, nw + nc, 8}), v = at::randn({2, nw + nc, 8});
  AttentionOptions opt;
  opt.n_window = nw;
  opt.mask.kind = AttentionMask::Causal;
  auto r = attention(q, k, v, at::Tensor(), opt);
  at::Tensor bias = at::zeros({nc, nw + nc}, at::kDouble);
  for (int i = 0; i < nc; ++i)
    for (int j = i + 1; j < nc; ++j) bias[i][nw + j] = -std::numeric_limits<double>::infinity();
  EXPECT_LT((r.out.to(at::kDouble) - reference(q, k, v, bias)).abs().max().item<double>(), 1e-5);
}

TEST(Attention, KeyMassSumsToQueriesTimesGroup) {
  at::Tensor q = at::randn({6, 4, 8}), k = at::randn({2, 10, 8}), v = at::randn({2, 10, 8});
  AttentionOptions opt;
  opt.capture_mass = true;
  auto r = attention(q, k, v, at::Tensor(), opt);
  ASSERT_EQ(r.key_mass.sizes(), (at::IntArrayRef{2, 10}));
  EXPECT_NEAR(r.key_mass.sum(1)[0].item<float>(), 3 * 4, 1e-4);
  EXPECT_NEAR(r.key_mass.sum(1)[1].item<float>(), 3 * 4, 1e-4);
}

TEST(Attention, HalfInputsOnCpuWork) {
  at::Tensor q = at::randn({2, 3, 8}), k = at::randn({1, 5, 8}), v = at::randn({1, 5, 8});
  auto f = attention(q, k, v, at::Tensor());
  auto h = attention(q.to(at::kHalf), k.to(at::kHalf), v.to(at::kHalf), at::Tensor());
  EXPECT_EQ(h.out.scalar_type(), at::kHalf);
  EXPECT_LT((h.out.to(at::kFloat) - f.out).abs().max().item<float>(), 1e-2);
}

TEST(Attention, RejectsBadShapes) {
  EXPECT_THROW(attention(at::randn({3, 2, 8}), at::randn({2, 4, 8}), at::randn({2, 4, 8}), at::Tensor()),
               std::exception);
  EXPECT_THROW(attention(at::randn({2, 2, 8}), at::randn({2, 4, 8}), at::randn({2, 4, 8}), at::zeros({3})),
               std::exception);
}

}  // namespace
}  // namespace wm
