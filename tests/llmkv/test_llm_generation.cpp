#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <torch/csrc/autograd/grad_mode.h>

#include "llmkv/beam.h"
#include "llmkv/model.h"
#include "llmkv/sampling.h"
#include "llm_test_util.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

using test::small_config;

TEST(LlmSampling, GreedyTakesTheFirstMaximum) {
  TokenSampler s({});
  EXPECT_EQ(s.sample(at::tensor({0.5f, 2.0f, -1.0f, 2.0f})), 1);
  EXPECT_THROW(s.sample(at::tensor({0.5f, NAN})), Error);
  EXPECT_THROW(s.sample(at::zeros({2, 2})), Error);
}

TEST(LlmSampling, OptionsAreValidated) {
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_THROW(o.validate(), Error);
  o.temperature = NAN;
  EXPECT_THROW(o.validate(), Error);
  o = {};
  o.top_p = 0.0;
  EXPECT_THROW(o.validate(), Error);
  o.top_p = 1.5;
  EXPECT_THROW(TokenSampler{o}, Error);
  o = {};
  o.top_k = -2;
  EXPECT_THROW(o.validate(), Error);
}

TEST(LlmSampling, DrawsFollowTheFilteredDistribution) {
  // p = softmax(log [0.5, 0.3, 0.15, 0.05]) at temperature 1.
  at::Tensor logits = at::log(at::tensor({0.5, 0.3, 0.15, 0.05}, at::kDouble)).to(at::kFloat);
  auto freq = [&](SamplingOptions o, int n) {
    TokenSampler s(o);
    std::vector<double> f(4, 0.0);
    for (int i = 0; i < n; ++i) f[s.sample(logits)] += 1.0 / n;
    return f;
  };
  SamplingOptions o;
  o.temperature = 1.0;
  o.seed = 7;
  const int n = 20000;
  auto f = freq(o, n);
  const double expect[4] = {0.5, 0.3, 0.15, 0.05};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], expect[i], 0.015) << i;  // > 4 sigma at n = 20000
  // top_k 2: [0.625, 0.375, 0, 0].
  o.top_k = 2;
  f = freq(o, n);
  EXPECT_NEAR(f[0], 0.625, 0.015);
  EXPECT_EQ(f[2] + f[3], 0.0);
  // top_p 0.7: the smallest prefix reaching 0.7 is {0, 1}.
  o.top_k = 0;
  o.top_p = 0.7;
  f = freq(o, n);
  EXPECT_NEAR(f[0], 0.625, 0.015);
  EXPECT_EQ(f[2] + f[3], 0.0);
  // A low temperature sharpens: p0 ∝ 0.5^(1/0.25) against the others.
  o = {};
  o.temperature = 0.25;
  o.seed = 3;
  f = freq(o, n);
  const double z = std::pow(0.5, 4) + std::pow(0.3, 4) + std::pow(0.15, 4) + std::pow(0.05, 4);
  EXPECT_NEAR(f[0], std::pow(0.5, 4) / z, 0.015);
}

TEST(LlmSampling, ASeedGivesTheSameDraws) {
  at::Tensor logits = at::randn({50});
  SamplingOptions o;
  o.temperature = 0.9;
  o.top_p = 0.95;
  o.seed = 11;
  TokenSampler a(o), b(o);
  o.seed = 12;
  TokenSampler c(o);
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    const int64_t x = a.sample(logits);
    EXPECT_EQ(x, b.sample(logits));
    differ += x != c.sample(logits);
  }
  EXPECT_GT(differ, 20);
}

TEST(LlmSampling, StopStringsAreHeldBackUntilDecided) {
  StopStrings s({"\nUser:", "END"});
  std::string shown;
  shown += s.feed("Hello");
  shown += s.feed(" wor");
  shown += s.feed("ld\nUs");  // "\nUs" could start "\nUser:"
  EXPECT_EQ(shown, "Hello world");
  EXPECT_FALSE(s.stopped());
  shown += s.feed("ually fine. EN");  // "\nUs" was not a stop after all; "EN" is held
  EXPECT_EQ(shown, "Hello world\nUsually fine. ");
  shown += s.feed("D and more");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched(), "END");
  EXPECT_EQ(shown, "Hello world\nUsually fine. ");
  EXPECT_EQ(s.feed("x"), "");
  StopStrings t({"STOP"});
  EXPECT_EQ(t.feed("abc ST"), "abc ");
  EXPECT_EQ(t.flush(), "ST");
}

// The model's distribution (log_softmax of the raw logits), whatever the sampler does with it;
// the alternatives most probable first, ties by lower id; the limits refused.
TEST(LlmSampling, TokenLogprobIsTheModelsDistribution) {
  const at::Tensor logits = at::tensor({1.0f, 3.0f, -2.0f, 3.0f, 0.5f});
  double z = 0.0;
  for (const double l : {1.0, 3.0, -2.0, 3.0, 0.5}) z += std::exp(l);
  const TokenLogprob t = token_logprob(logits, 4, 3);
  EXPECT_EQ(t.token, 4);
  EXPECT_NEAR(t.logprob, 0.5 - std::log(z), 1e-12);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 1);  // a tie with 3: the lower id first
  EXPECT_EQ(t.top[1].first, 3);
  EXPECT_EQ(t.top[2].first, 0);
  EXPECT_NEAR(t.top[0].second, 3.0 - std::log(z), 1e-12);
  EXPECT_EQ(t.top[0].second, t.top[1].second);
  EXPECT_NEAR(t.top[2].second, 1.0 - std::log(z), 1e-12);
  EXPECT_TRUE(token_logprob(logits, 2, 0).top.empty());
  EXPECT_EQ(token_logprob(logits, 2, kMaxTopLogprobs).top.size(), 5u);  // no more than the vocabulary
  EXPECT_THROW(token_logprob(logits, 5, 1), Error);
  EXPECT_THROW(token_logprob(logits, -1, 1), Error);
  EXPECT_THROW(token_logprob(logits, 0, kMaxTopLogprobs + 1), Error);
  EXPECT_THROW(token_logprob(logits, 0, -1), Error);
  EXPECT_THROW(token_logprob(at::zeros({2, 2}), 0, 1), Error);
}

TEST(LlmBeam, TableReorderRewritesTheTableNotTheKv) {
  KvSpec spec;
  spec.n_layers = 1;
  spec.n_kv_heads = 2;
  spec.head_dim = 4;
  spec.rope = RopeSpec::text1d(4);
  BeamKvCache cache(spec, 3, 8);
  at::Tensor pk = at::randn({2, 2, 4}), pv = at::randn({2, 2, 4});
  cache.write_prefix(0, pk, pv);
  at::Tensor k2 = at::randn({3, 2, 1, 4}), v2 = at::randn({3, 2, 1, 4});
  cache.write(0, 2, k2, v2);
  cache.reorder({2, 2, 0}, 3);  // beams 0 and 1 continue beam 2's history, beam 2 beam 0's
  auto [K, V] = cache.gather(0, 3);
  ASSERT_EQ(K.sizes(), (at::IntArrayRef{3, 2, 3, 4}));
  for (int b = 0; b < 3; ++b) {
    EXPECT_TRUE(at::equal(K[b].narrow(1, 0, 2), pk)) << b;
    EXPECT_TRUE(at::equal(V[b].narrow(1, 0, 2), pv)) << b;
  }
  const int parent[3] = {2, 2, 0};
  for (int b = 0; b < 3; ++b) EXPECT_TRUE(at::equal(K[b].narrow(1, 2, 1), k2[parent[b]])) << b;
  EXPECT_EQ(cache.table()[1][2].item<int64_t>(), 2);
  EXPECT_THROW(cache.reorder({0, 1}, 3), Error);
  EXPECT_THROW(cache.reorder({0, 1, 3}, 3), Error);
}

TEST(LlmBeam, BeamTableEqualsTheCopyingReference) {
  at::manual_seed(0);
  LlmModel model(small_config());
  model->init_weights(5);
  model->eval();
  for (int beams : {1, 3, 5}) {
    BeamOptions o;
    o.num_beams = beams;
    o.max_new_tokens = 12;
    o.eos_token_ids = {3, 17};  // frequent enough here that some beams finish early
    o.prefill_chunk = 4;
    const std::vector<int64_t> prompt = {5, 9, 2, 44, 31, 7, 7, 12, 60, 1};
    BeamResult a = beam_search(*model, prompt, o, at::kCPU);
    BeamResult b = beam_search_copying(*model, prompt, o, at::kCPU);
    ASSERT_EQ(a.beams.size(), static_cast<size_t>(beams));
    ASSERT_EQ(a.beams.size(), b.beams.size());
    for (size_t i = 0; i < a.beams.size(); ++i) {
      EXPECT_EQ(a.beams[i].tokens, b.beams[i].tokens) << beams << " beam " << i;
      EXPECT_EQ(a.beams[i].score, b.beams[i].score) << beams << " beam " << i;  // bit for bit
      EXPECT_EQ(a.beams[i].finished, b.beams[i].finished);
    }
    EXPECT_EQ(a.bytes_copied, 0u);
    if (beams > 1) EXPECT_GT(b.bytes_copied, 0u);
    // Ranked best first, and the best beam's score is the sum of its tokens' log-probabilities.
    for (size_t i = 1; i < a.beams.size(); ++i) EXPECT_GE(a.beams[i - 1].ranked, a.beams[i].ranked);
  }
}

// Sum of log-probabilities of `gen` after `prompt`, by one full pass.
double sequence_logprob(LlmModelImpl& m, const std::vector<int64_t>& prompt, const std::vector<int64_t>& gen) {
  torch::NoGradGuard ng;
  std::vector<int64_t> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end());
  at::Tensor lp = at::log_softmax(m.forward_train(at::tensor(seq, at::kLong).unsqueeze(0))[0].to(at::kDouble), -1);
  double s = 0.0;
  for (size_t i = 0; i < gen.size(); ++i) s += lp[prompt.size() - 1 + i][gen[i]].item<double>();
  return s;
}

TEST(LlmBeam, HypothesesAreWhatTheModelScores) {
  LlmModel model(small_config());
  model->init_weights(21);
  model->eval();
  const std::vector<int64_t> prompt = {4, 8, 15, 16, 23, 42};
  for (int n_eos : {0, 3, 12}) {
    BeamOptions o;
    o.num_beams = 4;
    o.max_new_tokens = 9;
    for (int i = 0; i < n_eos; ++i) o.eos_token_ids.push_back(2 + 5 * i);  // many end tokens: early finishes
    BeamResult r = beam_search(*model, prompt, o, at::kCPU);
    ASSERT_EQ(r.beams.size(), 4u) << n_eos;
    bool any_open = false;
    for (const auto& b : r.beams) {
      ASSERT_FALSE(b.tokens.empty());
      EXPECT_NEAR(b.score, sequence_logprob(*model, prompt, b.tokens), 1e-4) << n_eos;
      if (b.finished) {
        EXPECT_NE(std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), b.tokens.back()), o.eos_token_ids.end());
        EXPECT_NEAR(b.ranked, b.score / (b.tokens.size() - 1.0), 1e-12);
      } else {
        any_open = true;
        EXPECT_EQ(b.tokens.size(), 9u);  // open beams only at the token limit
      }
    }
    // The search stops at the token limit or once 4 hypotheses finished, never with a stale beam.
    if (any_open) {
      int finished = 0;
      for (const auto& b : r.beams) finished += b.finished;
      EXPECT_LT(finished, 4);
    }
    if (n_eos == 12) EXPECT_TRUE(r.beams[0].finished);
    // No two hypotheses are the same sequence.
    for (size_t i = 0; i < r.beams.size(); ++i)
      for (size_t j = i + 1; j < r.beams.size(); ++j) EXPECT_NE(r.beams[i].tokens, r.beams[j].tokens) << n_eos;
  }
}

TEST(LlmBeam, OneBeamIsGreedy) {
  LlmModel model(small_config());
  model->init_weights(9);
  model->eval();
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6};
  BeamOptions o;
  o.num_beams = 1;
  o.max_new_tokens = 8;
  BeamResult r = beam_search(*model, prompt, o, at::kCPU);
  // Greedy decoding by recomputing the whole sequence each step.
  std::vector<int64_t> seq = prompt;
  double score = 0.0;
  torch::NoGradGuard ng;
  for (int i = 0; i < 8; ++i) {
    at::Tensor logits = model->forward_train(at::tensor(seq, at::kLong).unsqueeze(0))[0][-1];
    at::Tensor lp = log_probs64(logits);
    const int64_t t = lp.argmax().item<int64_t>();
    score += lp[t].item<double>();
    seq.push_back(t);
  }
  EXPECT_EQ(r.beams[0].tokens, std::vector<int64_t>(seq.begin() + 6, seq.end()));
  EXPECT_NEAR(r.beams[0].score, score, 1e-4);
}

}  // namespace
}  // namespace wm::llm
