// The serving engine (llmkv/serve_engine.h) driven directly, with the embedded model: the context
// limit holds when several requests of one session come at once; text is valid UTF-8 whatever is
// sampled; the memory limits hold when the state folder refuses writes (and the answers say their
// session was not saved); a request cut by drain's time limit says so; a request repeated with
// its idempotency key is answered again without being fed twice.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <future>

#include "llmkv/byte_level.h"
#include "llmkv/hf_folder.h"
#include "llmkv/serve_engine.h"
#include "runtime/error.h"

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

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
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
    r.on_text = [&](const std::string& t) {
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
  const fs::path d = fresh_dir("wm_serve_engine_full_disk");
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
  fs::remove_all(d);
}

TEST(ServeEngine, DrainCutSaysInterrupted) {
  Fixture fx;
  ServeEngine engine(fx.model, fx.tok, at::kCPU, at::kFloat, ServeOptions{});
  ServeRequest r = request(fx.tok, "long", "rode 42\n", 3000);
  r.gen.stop_tokens.clear();
  std::promise<void> first;
  bool told = false;
  r.on_text = [&](const std::string&) {
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
  const fs::path d = fresh_dir("wm_serve_engine_idem");
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
  fs::remove_all(d);
}

TEST(ServeEngine, StateFolderBudgetEndsTheLeastRecentlyUsedSavedSessions) {
  Fixture fx;
  const fs::path d = fresh_dir("wm_serve_engine_budget");
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
  fs::remove_all(d);
}

}  // namespace serve_engine_test
}  // namespace wm::llm
