#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/onednn.h"

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

// Reference over the general case, built from the definition alone: q [B, H, nq, d], k/v
// [B, KH, nk, d], logw [nk] or undefined; mask block 0 = none, 1 = causal, b = block-causal;
// query r is current token (n_cur - nq + r); extra: a dense additive bias or undefined. Float64,
// kv heads repeated, explicit softmax.
struct Ref {
  at::Tensor out;   // [B, H, nq, d] float64
  at::Tensor mass;  // [B, KH, nk] float64
};
Ref reference4(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw, int64_t block,
               int64_t n_window, const at::Tensor& extra = at::Tensor()) {
  const int64_t B = q.size(0), H = q.size(1), nq = q.size(2), d = q.size(3), KH = k.size(1), nk = k.size(2);
  const int64_t G = H / KH, n_cur = nk - n_window;
  at::Tensor kk = k.to(at::kDouble).repeat_interleave(G, 1), vv = v.to(at::kDouble).repeat_interleave(G, 1);
  at::Tensor bias = at::zeros({nq, nk}, at::kDouble);
  if (logw.defined()) bias = bias + logw.to(at::kDouble).unsqueeze(0);
  at::Tensor hide = at::zeros({nq, nk}, at::kDouble);
  auto h = hide.accessor<double, 2>();
  if (block > 0)
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t j = 0; j < n_cur; ++j)
        if (j / block > (n_cur - nq + r) / block) h[r][n_window + j] = -std::numeric_limits<double>::infinity();
  at::Tensor s = at::matmul(q.to(at::kDouble), kk.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
  if (extra.defined()) bias = bias + extra.to(at::kDouble);  // [nq, nk] or [B or 1, 1, nq, nk]
  at::Tensor p = at::softmax(s + bias + hide, -1);
  return {at::matmul(p, vv), p.view({B, KH, G, nq, nk}).sum({2, 3})};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Chunk sizes to try: automatic, one query row per chunk (the minimum rows), a few rows, and
// budgets that split the heads into groups of one, two or more kv heads.
const int64_t kChunkSizes[] = {0, 1, 200, 1500, 9000, 40000};

AttentionOptions options(AttentionMask::Kind kind, int64_t block, int64_t n_window, int64_t chunk_elems) {
  AttentionOptions o;
  o.mask.kind = kind;
  o.mask.block = block;
  o.n_window = n_window;
  o.chunk_elems = chunk_elems;
  return o;
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

// Batched causal self-attention with GQA, as the LLM's training pass calls it (q and k as views
// of token-major projections), for chunkings from one chunk down to the minimum rows.
TEST(Attention, BatchedCausalGqaMatchesReferenceForAnyChunking) {
  at::manual_seed(4);
  const int64_t B = 3, T = 37, H = 6, KH = 2, d = 16;
  at::Tensor q = at::randn({B, T, H, d}).transpose(1, 2), k = at::randn({B, T, KH, d}).transpose(1, 2);
  at::Tensor v = at::randn({B, KH, T, d});
  Ref ref = reference4(q, k, v, at::Tensor(), 1, 0);
  for (int64_t ce : kChunkSizes)
    for (bool fused : {true, false}) {
      AttentionOptions o = options(AttentionMask::Causal, 1, 0, ce);
      o.allow_fused = fused;
      auto r = attention(q, k, v, at::Tensor(), o);
      ASSERT_EQ(r.out.sizes(), (at::IntArrayRef{B, H, T, d}));
      EXPECT_LT(max_diff(r.out, ref.out), 1e-5) << "chunk_elems " << ce << " fused " << fused;
    }
}

// Chunked prefill: queries are the last n_q of the current tokens, behind a window, with
// log-weights on the window's keys; unbatched as step() calls it.
TEST(Attention, CausalPrefillWithWindowAndLogWeightsMatchesReference) {
  at::manual_seed(5);
  const int64_t nw = 23, n_cur = 30, nq = 19, H = 4, KH = 1, d = 8;
  at::Tensor q = at::randn({H, nq, d}), k = at::randn({KH, nw + n_cur, d}), v = at::randn({KH, nw + n_cur, d});
  at::Tensor logw = at::zeros({nw + n_cur});
  logw.narrow(0, 0, nw).uniform_(-1.0, 2.0);
  Ref ref = reference4(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), logw, 1, nw);
  for (int64_t ce : kChunkSizes) {
    AttentionOptions o = options(AttentionMask::Causal, 1, nw, ce);
    o.capture_mass = true;
    auto r = attention(q, k, v, logw, o);
    EXPECT_LT(max_diff(r.out, ref.out.squeeze(0)), 1e-5) << "chunk_elems " << ce;
    ASSERT_EQ(r.key_mass.sizes(), (at::IntArrayRef{KH, nw + n_cur}));
    EXPECT_LT(max_diff(r.key_mass, ref.mass.squeeze(0)), 1e-4) << "chunk_elems " << ce;
  }
}

// Block-causal behind a window, with the queries starting mid-block (phase != 0) and blocks
// that do not divide the current tokens; GQA and batched.
TEST(Attention, BlockCausalWithWindowMatchesReferenceForAnyChunking) {
  at::manual_seed(6);
  const int64_t B = 2, H = 4, KH = 2, d = 8, nw = 11, n_cur = 26, block = 4;
  at::Tensor k = at::randn({B, KH, nw + n_cur, d}), v = at::randn({B, KH, nw + n_cur, d});
  at::Tensor logw = at::randn({nw + n_cur}) * 0.5;
  for (int64_t nq : {n_cur, int64_t{21}, int64_t{3}}) {
    at::Tensor q = at::randn({B, H, nq, d});
    for (const at::Tensor& lw : {at::Tensor(), logw}) {
      Ref ref = reference4(q, k, v, lw, block, nw);
      for (int64_t ce : kChunkSizes)
        for (bool fused : {true, false}) {
          AttentionOptions o = options(AttentionMask::BlockCausal, block, nw, ce);
          o.allow_fused = fused;
          auto r = attention(q, k, v, lw, o);
          EXPECT_LT(max_diff(r.out, ref.out), 1e-5) << "nq " << nq << " chunk_elems " << ce;
        }
    }
  }
}

// No mask, many queries: chunks of the queries over all keys (the video path's shape).
TEST(Attention, UnmaskedChunksMatchReferenceWithMass) {
  at::manual_seed(7);
  const int64_t H = 4, KH = 4, d = 12, nq = 40, nk = 57;
  at::Tensor q = at::randn({H, nq, d}), k = at::randn({KH, nk, d}), v = at::randn({KH, nk, d});
  at::Tensor logw = at::randn({nk});
  Ref ref = reference4(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), logw, 0, 17);
  for (int64_t ce : kChunkSizes) {
    AttentionOptions o = options(AttentionMask::None, 1, 17, ce);
    o.capture_mass = true;
    auto r = attention(q, k, v, logw, o);
    EXPECT_LT(max_diff(r.out, ref.out.squeeze(0)), 1e-5) << "chunk_elems " << ce;
    EXPECT_LT(max_diff(r.key_mass, ref.mass.squeeze(0)), 1e-4) << "chunk_elems " << ce;
  }
}

// The inputs are left as they were (the queries are scaled and the softmax runs in place on
// internal tensors only), also under NoGradGuard.
TEST(Attention, LeavesInputsUntouched) {
  at::manual_seed(8);
  at::Tensor q = at::randn({1, 2, 9, 8}), k = at::randn({1, 2, 9, 8}), v = at::randn({1, 2, 9, 8});
  at::Tensor q0 = q.clone(), k0 = k.clone(), v0 = v.clone();
  at::NoGradGuard no_grad;
  attention(q, k, v, at::Tensor(), options(AttentionMask::Causal, 1, 0, 1));
  EXPECT_TRUE(q.equal(q0));
  EXPECT_TRUE(k.equal(k0));
  EXPECT_TRUE(v.equal(v0));
}

// Gradients through the chunked path equal autograd through the float64 reference: causal
// batched GQA (training), causal behind a window with log-weights (a prefill under autograd),
// block-causal; in float32 within 1e-5 and in float64 within 1e-10.
TEST(Attention, GradientsMatchReference) {
  struct Case {
    AttentionMask::Kind kind;
    int64_t block, B, H, KH, nq, nw, n_cur;
    bool logw;
  };
  const Case cases[] = {{AttentionMask::Causal, 1, 2, 6, 2, 21, 0, 21, false},
                        {AttentionMask::Causal, 1, 1, 4, 2, 13, 9, 17, true},
                        {AttentionMask::BlockCausal, 3, 2, 2, 1, 14, 5, 16, true},
                        {AttentionMask::None, 1, 1, 3, 3, 10, 6, 10, true}};
  at::manual_seed(9);
  const int64_t d = 8;
  for (const Case& c : cases)
    for (auto dt : {at::kFloat, at::kDouble})
      for (int64_t ce : kChunkSizes) {
        const int64_t nk = c.nw + c.n_cur;
        at::Tensor q = at::randn({c.B, c.H, c.nq, d}, dt).requires_grad_();
        at::Tensor k = at::randn({c.B, c.KH, nk, d}, dt).requires_grad_();
        at::Tensor v = at::randn({c.B, c.KH, nk, d}, dt).requires_grad_();
        at::Tensor lw = c.logw ? at::randn({nk}) : at::Tensor();
        at::Tensor w = at::randn({c.B, c.H, c.nq, d}, dt);  // a random linear loss
        AttentionOptions o = options(c.kind, c.block, c.nw, ce);
        o.allow_fused = false;
        (attention(q, k, v, lw, o).out * w).sum().backward();
        at::Tensor qd = q.detach().to(at::kDouble).requires_grad_(), kd = k.detach().to(at::kDouble).requires_grad_();
        at::Tensor vd = v.detach().to(at::kDouble).requires_grad_();
        const int64_t block = c.kind == AttentionMask::None ? 0 : c.block;
        (reference4(qd, kd, vd, lw, block, c.nw).out * w.to(at::kDouble)).sum().backward();
        const double tol = dt == at::kFloat ? 1e-5 : 1e-10;
        EXPECT_LT(max_diff(q.grad(), qd.grad()), tol) << "block " << block << " chunk_elems " << ce;
        EXPECT_LT(max_diff(k.grad(), kd.grad()), tol) << "block " << block << " chunk_elems " << ce;
        EXPECT_LT(max_diff(v.grad(), vd.grad()), tol) << "block " << block << " chunk_elems " << ce;
      }
}

// Log-weights that require grad get theirs (the plain path), equal to the reference's.
TEST(Attention, LogWeightGradientMatchesReference) {
  at::manual_seed(10);
  const int64_t nw = 5, n_cur = 7, d = 8;
  at::Tensor q = at::randn({1, 4, n_cur, d}, at::kDouble).requires_grad_();
  at::Tensor k = at::randn({1, 2, nw + n_cur, d}, at::kDouble), v = at::randn({1, 2, nw + n_cur, d}, at::kDouble);
  at::Tensor lw = at::randn({nw + n_cur}).requires_grad_();
  at::Tensor w = at::randn({1, 4, n_cur, d}, at::kDouble);
  AttentionOptions o = options(AttentionMask::Causal, 1, nw, 0);
  o.allow_fused = false;
  (attention(q, k, v, lw, o).out * w).sum().backward();
  at::Tensor lwd = lw.detach().to(at::kDouble).requires_grad_();
  at::Tensor qd = q.detach().clone().requires_grad_();
  (reference4(qd, k, v, lwd, 1, nw).out * w).sum().backward();
  ASSERT_TRUE(lw.grad().defined());
  EXPECT_GT(lw.grad().abs().sum().item<double>(), 0.0);
  EXPECT_LT(max_diff(lw.grad(), lwd.grad()), 1e-5);
  EXPECT_LT(max_diff(q.grad(), qd.grad()), 1e-10);
}

// A mass capture under autograd still returns the mass, and the output's gradient is unchanged.
TEST(Attention, KeyMassUnderAutogradMatchesReference) {
  at::manual_seed(11);
  at::Tensor q = at::randn({2, 6, 11, 8}).requires_grad_(), k = at::randn({2, 3, 15, 8}), v = at::randn({2, 3, 15, 8});
  AttentionOptions o = options(AttentionMask::Causal, 1, 4, 100);
  o.capture_mass = true;
  auto r = attention(q, k, v, at::Tensor(), o);
  Ref ref = reference4(q.detach(), k, v, at::Tensor(), 1, 4);
  EXPECT_FALSE(r.key_mass.requires_grad());
  EXPECT_LT(max_diff(r.key_mass, ref.mass), 1e-4);
  EXPECT_LT(max_diff(r.out, ref.out), 1e-5);
}

// A dense bias (random finite values and hidden keys, every query keeping some) on top of the
// mask kinds and log-weights: outputs, key mass and gradients equal the reference's, [nq, nk]
// and [B, 1, nq, nk], with GQA, for every chunk size and with fused SDPA allowed or not.
TEST(Attention, DenseBiasMatchesReference) {
  struct Case {
    AttentionMask::Kind kind;
    int64_t block, nw;
    bool batched_bias, logw;
  };
  const Case cases[] = {{AttentionMask::None, 1, 0, false, false},
                        {AttentionMask::None, 1, 6, true, true},
                        {AttentionMask::Causal, 1, 4, true, false},
                        {AttentionMask::BlockCausal, 3, 5, false, true}};
  at::manual_seed(12);
  const int64_t B = 2, H = 4, KH = 2, nq = 10, d = 8;
  for (const Case& c : cases)
    for (bool fused : {false, true})
      for (int64_t ce : kChunkSizes) {
        const int64_t nk = c.nw + nq + 2;  // two current keys before the queries
        at::Tensor q = at::randn({B, H, nq, d}).requires_grad_();
        at::Tensor k = at::randn({B, KH, nk, d}).requires_grad_(), v = at::randn({B, KH, nk, d}).requires_grad_();
        at::Tensor lw = c.logw ? at::randn({nk}) : at::Tensor();
        at::Tensor bias = at::randn({c.batched_bias ? B : 1, 1, nq, nk});
        bias.masked_fill_(at::rand(bias.sizes()).lt(0.3), -std::numeric_limits<double>::infinity());
        bias.select(3, 0).fill_(0.0);  // key 0 (seen by every query under every mask) stays visible
        if (!c.batched_bias) bias = bias.view({nq, nk});
        at::Tensor w = at::randn({B, H, nq, d});
        AttentionOptions o = options(c.kind, c.block, c.nw, ce);
        o.bias = bias;
        o.allow_fused = fused;
        o.capture_mass = !fused;
        auto r = attention(q, k, v, lw, o);
        (r.out * w).sum().backward();
        at::Tensor qd = q.detach().to(at::kDouble).requires_grad_(), kd = k.detach().to(at::kDouble).requires_grad_();
        at::Tensor vd = v.detach().to(at::kDouble).requires_grad_();
        const int64_t block = c.kind == AttentionMask::None ? 0 : c.block;
        Ref ref = reference4(qd, kd, vd, lw, block, c.nw, bias);
        (ref.out * w.to(at::kDouble)).sum().backward();
        EXPECT_LT(max_diff(r.out, ref.out), 1e-5) << "block " << block << " chunk_elems " << ce;
        if (!fused) EXPECT_LT(max_diff(r.key_mass, ref.mass), 1e-4) << "block " << block << " chunk_elems " << ce;
        EXPECT_LT(max_diff(q.grad(), qd.grad()), 1e-5) << "block " << block << " chunk_elems " << ce;
        EXPECT_LT(max_diff(k.grad(), kd.grad()), 1e-5) << "block " << block << " chunk_elems " << ce;
        EXPECT_LT(max_diff(v.grad(), vd.grad()), 1e-5) << "block " << block << " chunk_elems " << ce;
      }
}

// A bias that requires grad gets its gradient (the plain path), equal to the reference's.
// More query rows than a chunk of every head takes (kHeadRows): the heads stay together and the
// queries run in several chunks, with a batched bias and GQA, forward, mass and gradients.
TEST(Attention, AllHeadsInSeveralQueryChunksMatchReference) {
  at::manual_seed(13);
  const int64_t B = 2, H = 4, KH = 2, nq = 300, nw = 10, d = 8, nk = nw + nq;
  at::Tensor q = at::randn({B, H, nq, d}).requires_grad_();
  at::Tensor k = at::randn({B, KH, nk, d}).requires_grad_(), v = at::randn({B, KH, nk, d}).requires_grad_();
  at::Tensor bias = at::randn({B, 1, nq, nk});
  at::Tensor w = at::randn({B, H, nq, d});
  AttentionOptions o = options(AttentionMask::Causal, 1, nw, 256 * B * H * nk);  // 256 rows of every head
  o.bias = bias;
  o.allow_fused = false;
  o.capture_mass = true;
  auto r = attention(q, k, v, at::Tensor(), o);
  (r.out * w).sum().backward();
  at::Tensor qd = q.detach().to(at::kDouble).requires_grad_(), kd = k.detach().to(at::kDouble).requires_grad_();
  at::Tensor vd = v.detach().to(at::kDouble).requires_grad_();
  Ref ref = reference4(qd, kd, vd, at::Tensor(), 1, nw, bias);
  (ref.out * w.to(at::kDouble)).sum().backward();
  EXPECT_LT(max_diff(r.out, ref.out), 1e-5);
  EXPECT_LT(max_diff(r.key_mass, ref.mass), 1e-3);
  EXPECT_LT(max_diff(q.grad(), qd.grad()), 1e-5);
  EXPECT_LT(max_diff(k.grad(), kd.grad()), 1e-5);
  EXPECT_LT(max_diff(v.grad(), vd.grad()), 1e-5);
}

// A call without batch elements, heads or queries gives an empty output (and mass), with no
// chunk to run.
TEST(Attention, EmptyCallsGiveEmptyOutputs) {
  struct Case {
    int64_t B, H, KH, nq;
  };
  for (const Case& c : {Case{0, 4, 2, 5}, Case{1, 4, 2, 0}, Case{2, 0, 2, 3}}) {
    at::Tensor q = at::randn({c.B, c.H, c.nq, 8}), k = at::randn({c.B, c.KH, 7, 8}), v = at::randn({c.B, c.KH, 7, 8});
    for (int64_t ce : kChunkSizes) {
      AttentionOptions o = options(AttentionMask::None, 1, 0, ce);
      o.allow_fused = false;
      o.capture_mass = true;
      auto r = attention(q, k, v, at::Tensor(), o);
      EXPECT_EQ(r.out.sizes(), (at::IntArrayRef{c.B, c.H, c.nq, 8})) << "chunk_elems " << ce;
      EXPECT_EQ(r.key_mass.sizes(), (at::IntArrayRef{c.B, c.KH, 7}));
    }
  }
  // No kv heads at all is refused.
  EXPECT_THROW(attention(at::randn({1, 0, 3, 8}), at::randn({1, 0, 7, 8}), at::randn({1, 0, 7, 8}), at::Tensor()),
               Error);
}

TEST(Attention, DenseBiasGradientMatchesReference) {
  at::manual_seed(13);
  const int64_t nq = 6, nk = 9, d = 8;
  at::Tensor q = at::randn({2, 4, nq, d}, at::kDouble), k = at::randn({2, 2, nk, d}, at::kDouble);
  at::Tensor v = at::randn({2, 2, nk, d}, at::kDouble);
  at::Tensor bias = (at::randn({2, 1, nq, nk}) * 0.5).requires_grad_();
  at::Tensor w = at::randn({2, 4, nq, d}, at::kDouble);
  AttentionOptions o = options(AttentionMask::Causal, 1, 3, 0);
  o.bias = bias;
  o.allow_fused = false;
  (attention(q, k, v, at::Tensor(), o).out * w).sum().backward();
  at::Tensor bd = bias.detach().to(at::kDouble).requires_grad_();
  (reference4(q, k, v, at::Tensor(), 1, 3, bd).out * w).sum().backward();
  ASSERT_TRUE(bias.grad().defined());
  EXPECT_GT(bias.grad().abs().sum().item<double>(), 0.0);
  EXPECT_LT(max_diff(bias.grad(), bd.grad()), 1e-5);
}

TEST(Attention, DenseBiasOfTheWrongShapeIsAnError) {
  at::Tensor q = at::randn({2, 3, 4, 8}), k = at::randn({2, 1, 5, 8}), v = at::randn({2, 1, 5, 8});
  for (const at::Tensor& bad : {at::zeros({4, 4}), at::zeros({5, 4}), at::zeros({3, 1, 4, 5}), at::zeros({2, 2, 4, 5}),
                                at::zeros({4, 5, 1})}) {
    AttentionOptions o;
    o.bias = bad;
    EXPECT_THROW(attention(q, k, v, at::Tensor(), o), Error) << bad.sizes();
  }
  AttentionOptions o;
  o.bias = at::zeros({1, 1, 4, 5});
  EXPECT_NO_THROW(attention(q, k, v, at::Tensor(), o));
}

// attention_bias: the mask (shared by calls of one shape) plus log-weights plus the bias, and a
// new tensor each call: writing to one result leaves the next call's intact.
TEST(Attention, AttentionBiasIsANewTensorEachCall) {
  AttentionOptions o = options(AttentionMask::BlockCausal, 2, 1, 0);
  at::Tensor a = attention_bias(3, 6, at::Tensor(), o, at::kCPU);
  const float inf = std::numeric_limits<float>::infinity();
  // Keys [window | current 0..4]; queries are current tokens 2, 3, 4 (blocks 1, 1, 2).
  at::Tensor want = at::tensor({0.f, 0.f, 0.f, 0.f, 0.f, -inf,  //
                                0.f, 0.f, 0.f, 0.f, 0.f, -inf,  //
                                0.f, 0.f, 0.f, 0.f, 0.f, 0.f})
                        .view({3, 6});
  EXPECT_TRUE(a.equal(want));
  a.fill_(7.0);
  EXPECT_TRUE(attention_bias(3, 6, at::Tensor(), o, at::kCPU).equal(want));
  at::Tensor lw = at::arange(6, at::kFloat);
  o.bias = at::full({2, 1, 3, 6}, 0.5);
  at::Tensor b = attention_bias(3, 6, lw, o, at::kCPU);
  ASSERT_EQ(b.sizes(), (at::IntArrayRef{2, 1, 3, 6}));
  EXPECT_TRUE(b[1][0].equal(want + lw + 0.5));
}


namespace bf16_products {

// bfloat16 on a CPU with bfloat16 units (runtime/onednn.h): the products in bfloat16 with
// float32 accumulation, the probabilities rounded to bfloat16. Against the float64 reference of
// the same (bfloat16) values: the output's rounding (2^-8 of |out|: 8 significant bits) and the
// probabilities' (2^-8 of each, so at most 2^-8 of max |v|) bound the error; every mask kind, GQA, a window with
// log-weights, a dense bias, the key mass, every chunk size. The float32 path (the switch off)
// is held to the output's rounding alone.
TEST(Attention, Bf16ProductsOnTheCpuMatchTheReference) {
  if (!onednn::native_bf16()) GTEST_SKIP() << "no oneDNN in this build or no bfloat16 units on this CPU";
  struct Case {
    AttentionMask::Kind kind;
    int64_t block, nw;
    bool logw, bias;
  };
  const Case cases[] = {{AttentionMask::None, 1, 0, false, false},
                        {AttentionMask::None, 1, 9, true, true},
                        {AttentionMask::Causal, 1, 5, true, false},
                        {AttentionMask::BlockCausal, 4, 7, false, true}};
  at::manual_seed(21);
  const int64_t B = 2, H = 6, KH = 2, nq = 23, d = 32;
  const double half_ulp = std::ldexp(1.0, -8);
  for (const Case& c : cases) {
    const int64_t nk = c.nw + nq + 3;
    at::Tensor q = (at::randn({B, H, nq, d}) * 2).to(at::kBFloat16);
    at::Tensor k = at::randn({B, KH, nk, d}).to(at::kBFloat16), v = at::randn({B, KH, nk, d}).to(at::kBFloat16);
    at::Tensor lw = c.logw ? at::randn({nk}) : at::Tensor();
    at::Tensor bias;
    if (c.bias) {
      bias = at::randn({nq, nk});
      bias.masked_fill_(at::rand(bias.sizes()).lt(0.3), -std::numeric_limits<double>::infinity());
      bias.select(1, 0).fill_(0.0);
    }
    const int64_t block = c.kind == AttentionMask::None ? 0 : c.block;
    Ref ref = reference4(q, k, v, lw, block, c.nw, bias);
    const double v_max = v.to(at::kDouble).abs().max().item<double>();
    const double out_max = ref.out.abs().max().item<double>();
    for (int64_t ce : kChunkSizes)
      for (bool native : {true, false}) {
        AttentionOptions o = options(c.kind, c.block, c.nw, ce);
        o.bias = bias;
        o.allow_fused = false;
        o.capture_mass = ce == 0 || ce == 1 || ce == 9000;  // the mass: the float32 probabilities
        o.cpu_bf16_products = native;
        at::NoGradGuard no_grad;
        auto r = attention(q, k, v, lw, o);
        ASSERT_EQ(r.out.scalar_type(), at::kBFloat16);
        const double bound = native ? 1.1 * half_ulp * (out_max + v_max) + 1e-5 : 1.1 * half_ulp * out_max + 1e-5;
        EXPECT_LT(max_diff(r.out, ref.out), bound) << "block " << block << " chunk_elems " << ce << " native " << native;
        if (o.capture_mass) EXPECT_LT(max_diff(r.key_mass, ref.mass), 1e-3) << "block " << block << " chunk_elems " << ce;
      }
  }
}

// Shapes the attention meets on the world models (a head of 256 query rows over thousands of
// keys) and an LLM prefill's GQA: the two paths agree within the bound above.
TEST(Attention, Bf16ProductsOnTheCpuAtModelShapes) {
  if (!onednn::native_bf16()) GTEST_SKIP() << "no oneDNN in this build or no bfloat16 units on this CPU";
  at::manual_seed(22);
  struct Shape {
    int64_t H, KH, nq, nk, d;
    AttentionMask::Kind kind;
  };
  for (const Shape& s : {Shape{4, 4, 300, 3000, 128, AttentionMask::None}, Shape{9, 3, 200, 200, 64, AttentionMask::Causal}}) {
    at::Tensor q = at::randn({s.H, s.nq, s.d}).to(at::kBFloat16);
    at::Tensor k = at::randn({s.KH, s.nk, s.d}).to(at::kBFloat16), v = at::randn({s.KH, s.nk, s.d}).to(at::kBFloat16);
    Ref ref = reference4(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), at::Tensor(),
                         s.kind == AttentionMask::Causal ? 1 : 0, 0);
    AttentionOptions o;
    o.mask.kind = s.kind;
    at::NoGradGuard no_grad;
    auto r = attention(q, k, v, at::Tensor(), o);
    const double bound = 1.1 * std::ldexp(1.0, -8) * (ref.out.abs().max().item<double>() + v.to(at::kDouble).abs().max().item<double>()) + 1e-5;
    EXPECT_LT(max_diff(r.out, ref.out.squeeze(0)), bound) << "heads " << s.H << " keys " << s.nk;
  }
}

}  // namespace bf16_products

}  // namespace
}  // namespace wm
