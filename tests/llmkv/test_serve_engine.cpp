// The serving engine (llmkv/serve_engine.h) driven directly, with the embedded model: the context
// limit holds when several requests of one session come at once; text is valid UTF-8 whatever is
// sampled; the memory limits hold when the state folder refuses writes (and the answers say their
// session was not saved); a request cut by drain's time limit says so; a request repeated with
// its idempotency key is answered again without being fed twice; logprobs cover every generated
// token once, in the whole answer and in the pieces a listener gets, and leave greedy unchanged.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <future>

#include "llmkv/byte_level.h"
#include "llmkv/hf_folder.h"
#include "llmkv/serve_engine.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/temp_dir.h"

namespace wm::llm {
namespace serve_engine_test {

namespace fs = std::filesystem;

struct Fixture {
  std::string dir = std::string(WM_SOURCE_DIR) + "/assets/models/tiny-llm";
  LlmModel model = load_llm(dir, at::kCPU);
  Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
};

ServeRequest request(const Tokenizer& tok, const std::string& session, const std::string& text, int64_t max_tokens) {
  ServeRequest r;
  r.session = session;
  r.blocks.push_back({tok.encode(text, false), "user", true});
  r.gen.max_new_tokens = max_tokens;
  return r;
}

TEST(ServeEngine, ContextLimitHoldsForConcurrentRequestsOfOneSession) {
  Fixture fx;
  ServeOptions o;
  o.session.memory.policy = "full";
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, o);
  const int64_t limit = fx.model->config().max_position_embeddings;
  // Each request alone fits an empty session (about 1,500 of 4,096 positions); three together do not.
  std::string text;
  while (static_cast<int64_t>(fx.tok.encode(text, false).size()) < 1400) text += "rode 42 sora 17 ";
  std::vector<std::future<ServeResult>> f;
  for (int i = 0; i < 3; ++i) f.push_back(engine.submit(request(fx.tok, "s", text, 64)));
  int refused = 0;
  for (auto& x : f) {
    const ServeResult r = x.get();
    if (!r.error.empty()) {
      EXPECT_TRUE(r.bad_request) << r.error;
      ++refused;
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_LE(engine.session_position("s"), limit);
  EXPECT_EQ(engine.counters().too_long, refused);
}

TEST(ServeEngine, TextIsValidUtf8WhateverIsSampled) {
  Fixture fx;
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, ServeOptions{});
  int changed = 0;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    ServeRequest r = request(fx.tok, "", "x", 16);
    r.gen.sampling.temperature = 2.0;
    r.gen.sampling.seed = seed;
    std::string streamed;
    r.on_text = [&](const TextPiece& p) {
      const std::string& t = p.text;
      EXPECT_EQ(utf8_valid(t), t) << "a piece that is not valid UTF-8, seed " << seed;
      streamed += t;
      return true;
    };
    const ServeResult res = engine.submit(std::move(r)).get();
    ASSERT_TRUE(res.error.empty()) << res.error;
    EXPECT_EQ(utf8_valid(res.generation.text), res.generation.text) << "seed " << seed;
    EXPECT_EQ(streamed, res.generation.text);
    // The raw bytes of these tokens are not valid UTF-8 for some seeds: what the fix is about.
    const std::string raw = fx.tok.decode(res.generation.tokens, true);
    if (utf8_valid(raw) != raw) ++changed;
  }
  EXPECT_GT(changed, 0) << "no seed sampled invalid UTF-8: the test shows nothing";
}

TEST(ServeEngine, MemoryLimitsHoldWhenTheFolderRefusesWrites) {
  Fixture fx;
  const fs::path root = wm::testing::make_temp_dir("wm_serve_engine_full_disk_");
  const fs::path d = root / "state";
  ServeOptions o;
  o.max_sessions = 2;
  o.state_dir = d.string();
  o.log = [](const std::string&) {};
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, o);
  // A disk that takes no more: writes past 512 bytes fail (EFBIG), as on a full disk. Root
  // ignores permissions, not this limit.
  struct rlimit before;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 512;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  int unsaved = 0;
  for (int i = 0; i < 8; ++i) {
    const ServeResult r = engine.submit(request(fx.tok, "s" + std::to_string(i), "rode 42\n", 4)).get();
    EXPECT_TRUE(r.error.empty()) << r.error;
    unsaved += !r.saved;
  }
  ::setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  engine.drain();
  EXPECT_EQ(unsaved, 8) << "every answer says its session was not saved";
  EXPECT_LE(engine.sessions_in_memory(), 2);
  EXPECT_GE(engine.counters().ended, 6);
  EXPECT_EQ(engine.counters().save_failed, 8);
  fs::remove_all(root);
}

TEST(ServeEngine, DrainCutSaysInterrupted) {
  Fixture fx;
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, ServeOptions{});
  ServeRequest r = request(fx.tok, "long", "rode 42\n", 3000);
  r.gen.stop_tokens.clear();
  std::promise<void> first;
  bool told = false;
  r.on_text = [&](const TextPiece&) {
    if (!told) told = true, first.set_value();
    return true;
  };
  auto f = engine.submit(std::move(r));
  first.get_future().wait();
  engine.drain(0.05);
  const ServeResult res = f.get();
  EXPECT_TRUE(res.error.empty());
  EXPECT_EQ(res.generation.stop_reason, "interrupted");
  EXPECT_LT(res.generation.stats.new_tokens, 3000);
}

TEST(ServeEngine, RepeatedIdempotencyKeyIsAnsweredWithoutFeedingAgain) {
  Fixture fx;
  const fs::path root = wm::testing::make_temp_dir("wm_serve_engine_idem_");
  const fs::path d = root / "state";
  ServeOptions o;
  o.state_dir = d.string();
  ServeResult first, again, other;
  int64_t after_first = 0;
  {
    ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, o);
    ServeRequest a = request(fx.tok, "chat", "rode 42\nsora 17\nRecall:\nrode", 4);
    a.idempotency_key = "k1";
    first = engine.submit(a).get();
    after_first = engine.session_position("chat");
    again = engine.submit(a).get();
    EXPECT_EQ(engine.session_position("chat"), after_first);
  }
  ASSERT_TRUE(first.error.empty());
  EXPECT_FALSE(first.replayed);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.generation.text, first.generation.text);
  EXPECT_EQ(again.generation.stop_reason, first.generation.stop_reason);
  {
    // After a restart on the same folder the key is still known; another key runs.
    ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, o);
    ServeRequest a = request(fx.tok, "chat", "rode 42\nsora 17\nRecall:\nrode", 4);
    a.idempotency_key = "k1";
    const ServeResult r = engine.submit(a).get();
    EXPECT_TRUE(r.replayed);
    EXPECT_EQ(r.generation.text, first.generation.text);
    EXPECT_EQ(engine.session_position("chat"), after_first);
    a.idempotency_key = "k2";
    other = engine.submit(a).get();
    EXPECT_FALSE(other.replayed);
    EXPECT_GT(engine.session_position("chat"), after_first);
  }
  fs::remove_all(root);
}

TEST(ServeEngine, StateFolderBudgetEndsTheLeastRecentlyUsedSavedSessions) {
  Fixture fx;
  const fs::path root = wm::testing::make_temp_dir("wm_serve_engine_budget_");
  const fs::path d = root / "state";
  ServeOptions o;
  o.max_sessions = 1;  // idle sessions leave memory for the folder
  o.state_dir = d.string();
  o.state_max_bytes = 60000;
  o.log = [](const std::string&) {};
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, o);
  for (int i = 0; i < 8; ++i) {
    const ServeResult r = engine.submit(request(fx.tok, "b" + std::to_string(i), "rode 42\nsora 17\n", 4)).get();
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_TRUE(r.saved);
  }
  engine.drain();
  EXPECT_GT(engine.counters().state_evicted, 0);
  EXPECT_LT(engine.sessions(), 8);
  EXPECT_TRUE(engine.has_session("b7")) << "the session saved last was ended";
  EXPECT_FALSE(engine.has_session("b0")) << "the least recently used one stayed";
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".wmsess") bytes += fs::file_size(e.path());
  EXPECT_LE(bytes, 60000u);
  fs::remove_all(root);
}

// The pieces a listener got cover the generation's tokens once, in order, their text the
// generation's, their logprobs the generation's entries for the tokens they cover.
void expect_pieces_cover(const std::vector<TextPiece>& pieces, const Generation& g) {
  std::string text;
  int64_t at = 0;
  for (const TextPiece& p : pieces) {
    EXPECT_EQ(p.first, at);
    EXPECT_GE(p.end, p.first);
    at = p.end;
    text += p.text;
    if (g.logprobs.empty()) {
      EXPECT_TRUE(p.logprobs.empty());
      continue;
    }
    ASSERT_EQ(p.logprobs.size(), static_cast<size_t>(p.end - p.first));
    for (int64_t i = p.first; i < p.end; ++i) {
      EXPECT_EQ(p.logprobs[i - p.first].token, g.logprobs[i].token);
      EXPECT_EQ(p.logprobs[i - p.first].logprob, g.logprobs[i].logprob);
      EXPECT_EQ(p.logprobs[i - p.first].top, g.logprobs[i].top);
    }
  }
  EXPECT_EQ(at, static_cast<int64_t>(g.tokens.size())) << "tokens no piece covers";
  EXPECT_EQ(text, g.text);
}

// One entry per generated token, that token's; `top` alternatives sorted, all log-probabilities
// <= 0 and their probabilities summing to at most 1; greedy: the chosen one is the most probable.
void expect_logprobs_sound(const Generation& g, size_t top, bool greedy) {
  ASSERT_EQ(g.logprobs.size(), g.tokens.size());
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const TokenLogprob& lp = g.logprobs[i];
    EXPECT_EQ(lp.token, g.tokens[i]) << i;
    EXPECT_LE(lp.logprob, 0.0);
    ASSERT_EQ(lp.top.size(), top);
    double mass = 0.0;
    for (size_t k = 0; k < top; ++k) {
      EXPECT_LE(lp.top[k].second, 0.0);
      if (k > 0) EXPECT_GE(lp.top[k - 1].second, lp.top[k].second) << "not sorted at token " << i;
      mass += std::exp(lp.top[k].second);
    }
    EXPECT_LE(mass, 1.0 + 1e-12);
    if (top == 0) continue;
    if (greedy) EXPECT_EQ(lp.logprob, lp.top[0].second) << "greedy chose a token less probable than another, " << i;
    else EXPECT_LE(lp.logprob, lp.top[0].second);
  }
}

ServeResult run_listening(ServeEngine& engine, ServeRequest r, std::vector<TextPiece>* pieces) {
  r.on_text = [pieces](const TextPiece& p) {
    pieces->push_back(p);
    return true;
  };
  return engine.submit(std::move(r)).get();
}

// Greedy with logprobs and 5 alternatives: the same tokens and text as without (nothing of the
// sampling changes), one sound entry per token, the first the model's distribution after the
// prompt; the pieces cover the tokens once, also when a stop string or a stop token ends the text.
TEST(ServeEngine, LogprobsCoverEveryTokenOnceAndLeaveGreedyUnchanged) {
  Fixture fx;
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, ServeOptions{});
  const int64_t n_text = std::min<int64_t>(fx.tok.vocab_size(), fx.model->config().vocab_size);
  struct Case {
    std::string prompt;
    std::vector<std::string> stops;
    bool stop_token;
  };
  const std::vector<Case> cases = {{"rode 42\nsora 17\nRecall:\nrode", {}, false},
                                   {"rode 42\nsora 17\nRecall:\nsora", {"\n"}, false},
                                   {"rode 42\nsora 17\nRecall:\nsora", {}, true}};
  int stopped = 0;
  for (const Case& c : cases) {
    ServeRequest plain = request(fx.tok, "", c.prompt, 12);
    plain.gen.stop_strings = c.stops;
    if (c.stop_token) plain.gen.stop_tokens = {fx.tok.encode("\n", false).at(0)};
    ServeRequest with = plain;
    with.gen.logprobs = true;
    with.gen.top_logprobs = 5;
    std::vector<TextPiece> plain_pieces, pieces;
    const ServeResult a = run_listening(engine, plain, &plain_pieces);
    const ServeResult b = run_listening(engine, with, &pieces);
    ASSERT_TRUE(a.error.empty() && b.error.empty()) << a.error << b.error;
    EXPECT_EQ(a.generation.tokens, b.generation.tokens) << c.prompt;
    EXPECT_EQ(a.generation.text, b.generation.text);
    EXPECT_EQ(a.generation.stop_reason, b.generation.stop_reason);
    EXPECT_TRUE(a.generation.logprobs.empty());
    stopped += b.generation.stop_reason != "max_tokens";
    expect_logprobs_sound(b.generation, 5, true);
    expect_pieces_cover(plain_pieces, a.generation);
    expect_pieces_cover(pieces, b.generation);
    const TokenLogprob first =
        token_logprob(b.generation.prompt_logits.narrow(0, 0, n_text), b.generation.tokens[0], 5);
    EXPECT_NEAR(b.generation.logprobs[0].logprob, first.logprob, 1e-9);
  }
  EXPECT_EQ(stopped, 2) << "the stop string and the stop token did not end their answers: the test shows less";
}

// Sampled at temperature 2 (tokens that hold part of a character, text held back): the entries
// are the model's distribution, not the sampler's, and the pieces still cover every token once.
TEST(ServeEngine, SampledLogprobsAreTheModelsDistribution) {
  Fixture fx;
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, ServeOptions{});
  const int64_t n_text = std::min<int64_t>(fx.tok.vocab_size(), fx.model->config().vocab_size);
  int held = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    ServeRequest r = request(fx.tok, "", "x", 16);
    r.gen.sampling.temperature = 2.0;
    r.gen.sampling.seed = seed;
    r.gen.logprobs = true;
    r.gen.top_logprobs = 3;
    std::vector<TextPiece> pieces;
    const ServeResult res = run_listening(engine, r, &pieces);
    ASSERT_TRUE(res.error.empty()) << res.error;
    expect_logprobs_sound(res.generation, 3, false);
    expect_pieces_cover(pieces, res.generation);
    for (const TextPiece& p : pieces) held += p.end - p.first > 1;
    const TokenLogprob first =
        token_logprob(res.generation.prompt_logits.narrow(0, 0, n_text), res.generation.tokens[0], 3);
    EXPECT_NEAR(res.generation.logprobs[0].logprob, first.logprob, 1e-9) << "seed " << seed;
  }
  EXPECT_GT(held, 0) << "no piece covered more than one token: the test shows less";
}

}  // namespace serve_engine_test
}  // namespace wm::llm
