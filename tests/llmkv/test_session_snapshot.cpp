// Session snapshots (LlmSession::snapshot / restore) and sessions kept in Redis
// (llmkv/session_store.h): a conversation taken up by another session object, or through the
// store by another connection (as another process would), goes on exactly as the one that never
// stopped.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "llm_test_util.h"
#include "llmkv/session.h"
#include "llmkv/session_store.h"
#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/remote_store.h"
#include "tests/runtime/redis_server.h"

namespace wm::llm {
namespace {

Tokenizer fixture_tokenizer() {
  return Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json");
}

// An evoke session with a budget a few blocks exceed: blocks leave for the bank, and messages
// bring the relevant ones back.
SessionOptions evoke_options(const std::string& relevance) {
  SessionOptions so;
  so.prefill_chunk = 16;
  so.memory.policy = "evoke";
  so.memory.budget = 40;
  so.memory.relevance = relevance;
  return so;
}

// A conversation in pieces: `blocks` blocks of facts, then a message and its answer one token per
// step. Block and message names carry `tag` so that two calls make distinct blocks.
struct Part {
  std::vector<int64_t> ids;
  std::vector<PromptPiece> pieces;
};
Part conversation_part(const Tokenizer& tok, const std::string& tag, int blocks) {
  Part p;
  for (int b = 0; b < blocks; ++b) {
    const auto t = tok.encode("Recall " + tag + std::to_string(b) + ": " + std::to_string(3117 + 7 * b) + "\n");
    p.ids.insert(p.ids.end(), t.begin(), t.end());
    p.pieces.push_back({static_cast<int64_t>(p.ids.size()), tag + "b" + std::to_string(b), false, false});
  }
  const auto q = tok.encode("Recall " + tag + "1:");
  p.ids.insert(p.ids.end(), q.begin(), q.end());
  p.pieces.push_back({static_cast<int64_t>(p.ids.size()), tag + "q", true, false});
  const auto a = tok.encode(" 3124\n");
  p.ids.insert(p.ids.end(), a.begin(), a.end());
  p.pieces.push_back({static_cast<int64_t>(p.ids.size()), tag + "a", false, true});
  return p;
}

// What a session predicts over a part, and the log-probabilities after its last 3 tokens.
struct Out {
  std::vector<int64_t> pred;
  std::vector<at::Tensor> lp;
};
Out run_part(LlmSession& s, const Part& p) {
  const int64_t n = static_cast<int64_t>(p.ids.size());
  s.keep_log_probs({n - 3, n - 2, n - 1});
  Out o;
  o.pred = s.predict_pieces(p.ids, p.pieces);
  o.lp = s.take_log_probs();
  return o;
}

void expect_same(const Out& a, const Out& b) {
  EXPECT_EQ(a.pred, b.pred);
  ASSERT_EQ(a.lp.size(), b.lp.size());
  for (size_t i = 0; i < a.lp.size(); ++i) EXPECT_TRUE(at::equal(a.lp[i], b.lp[i])) << "log-probabilities " << i;
}

TEST(SessionSnapshot, EvokeSessionRestoredGoesOnBitForBit) {
  torch::NoGradGuard ng;
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = test::random_model(tok.vocab_size(), 11, 64);
  for (const std::string relevance : {"hidden", "attention"}) {
    LlmSession a(m, tok, at::kCPU, at::kFloat, evoke_options(relevance));
    const Part p1 = conversation_part(tok, "x", 6), p2 = conversation_part(tok, "y", 4);
    run_part(a, p1);
    ASSERT_GT(a.policy().evictions(), 0) << relevance << ": the test needs blocks in the bank";
    ASSERT_GT(a.memory().bank().size(), 0u) << relevance;
    const SessionSnapshot snap = a.snapshot();
    LlmSession b(m, tok, at::kCPU, at::kFloat, evoke_options(relevance));
    b.restore(snap);
    EXPECT_EQ(b.window().size(0), a.window().size(0));
    EXPECT_EQ(b.memory().bank().ids(), a.memory().bank().ids());
    EXPECT_EQ(b.next_position(), a.next_position());
    EXPECT_EQ(b.policy().evictions(), a.policy().evictions());
    const Out wa = run_part(a, p2), wb = run_part(b, p2);
    expect_same(wa, wb);
    EXPECT_GT(a.policy().recoveries(), 0) << relevance << ": the second part brings banked blocks back";
    EXPECT_EQ(b.policy().recoveries(), a.policy().recoveries()) << relevance;
    EXPECT_EQ(b.policy().evictions(), a.policy().evictions()) << relevance;
    // The window's K/V after both are the same bits.
    for (int l = 0; l < m->config().num_hidden_layers; ++l) {
      EXPECT_TRUE(at::equal(a.window().k(l), b.window().k(l))) << relevance << " layer " << l;
      EXPECT_TRUE(at::equal(a.window().pos(l), b.window().pos(l))) << relevance << " layer " << l;
    }
  }
}

TEST(SessionSnapshot, SampledGenerationGoesOnWithItsPendingTokenAndStream) {
  torch::NoGradGuard ng;
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = test::random_model(tok.vocab_size(), 4, 64);
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.sampling.temperature = 0.9;
  go.sampling.seed = 77;
  LlmSession a(m, tok, at::kCPU, at::kFloat, {});
  a.generate(tok.encode("Recall fada: 3117\nRecall piti:"), go);
  LlmSession b(m, tok, at::kCPU, at::kFloat, {});
  b.restore(a.snapshot());  // a's last token is pending, and one generation has drawn its stream
  const std::vector<int64_t> next = tok.encode("\nRecall fada:");
  const Generation ga = a.generate(next, go), gb = b.generate(next, go);
  EXPECT_EQ(ga.tokens, gb.tokens);
  EXPECT_TRUE(at::equal(ga.prompt_logits, gb.prompt_logits));
  // A restored session has no last logits: generating without a prompt or pending token is refused.
  LlmSession c(m, tok, at::kCPU, at::kFloat, {});
  c.feed(tok.encode("Recall fada"));
  LlmSession d(m, tok, at::kCPU, at::kFloat, {});
  d.restore(c.snapshot());
  EXPECT_THROW(d.generate({}, go), Error);
}

TEST(SessionSnapshot, RefusesWhatDoesNotFit) {
  torch::NoGradGuard ng;
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = test::random_model(tok.vocab_size(), 5, 64);
  LlmSession a(m, tok, at::kCPU, at::kFloat, evoke_options("hidden"));
  run_part(a, conversation_part(tok, "x", 6));
  const SessionSnapshot snap = a.snapshot();
  // Another policy.
  LlmSession full(m, tok, at::kCPU, at::kFloat, {});
  EXPECT_THROW(full.restore(snap), Error);
  // A banked block missing: the policy's state names it.
  SessionSnapshot broken = snap;
  ASSERT_FALSE(broken.bank.empty());
  broken.bank.pop_back();
  broken.state["bank"].erase(broken.state["bank"].size() - 1);
  LlmSession b(m, tok, at::kCPU, at::kFloat, evoke_options("hidden"));
  EXPECT_THROW(b.restore(broken), CorruptData);
  EXPECT_EQ(b.window().size(0), 0) << "a failed restore leaves the session empty";
  EXPECT_EQ(b.memory().bank().size(), 0u);
  // Lists and blocks that disagree.
  SessionSnapshot mixed = snap;
  std::swap(mixed.window.front(), mixed.window.back());
  EXPECT_THROW(b.restore(mixed), CorruptData);
  // A policy with per-token state a snapshot does not hold.
  SessionOptions h2o;
  h2o.memory.policy = "h2o";
  h2o.memory.budget = 40;
  LlmSession h(m, tok, at::kCPU, at::kFloat, h2o);
  h.feed(tok.encode("Recall fada: 3117"));
  EXPECT_THROW(h.snapshot(), Error);
}

TEST(SessionStore, SessionContinuesThroughRedisAsInAnotherProcess) {
  if (testing::RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
  testing::RedisServer server;
  ASSERT_TRUE(server.start());
  torch::NoGradGuard ng;
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = test::random_model(tok.vocab_size(), 11, 64);
  RemoteConfig rc;
  rc.url = server.url();
  rc.ns = "snapshot-test";
  std::vector<std::string> warnings;
  rc.log = [&](const std::string& w) { warnings.push_back(w); };
  const Part p1 = conversation_part(tok, "x", 6), p2 = conversation_part(tok, "y", 4),
             p3 = conversation_part(tok, "z", 3);
  // The reference: one session, never stopped.
  LlmSession ref(m, tok, at::kCPU, at::kFloat, evoke_options("hidden"));
  run_part(ref, p1);
  const Out r2 = run_part(ref, p2), r3 = run_part(ref, p3);
  // Each part by a new session over a new connection, saved after it.
  {
    RemoteStore store(rc);
    LlmSession s(m, tok, at::kCPU, at::kFloat, evoke_options("hidden"));
    EXPECT_FALSE(load_session(s, store, "conv-1")) << "no such session yet";
    run_part(s, p1);
    save_session(s, store, "conv-1");
  }
  for (int turn = 2; turn <= 3; ++turn) {
    RemoteStore store(rc);
    LlmSession s(m, tok, at::kCPU, at::kFloat, evoke_options("hidden"));
    ASSERT_TRUE(load_session(s, store, "conv-1"));
    expect_same(run_part(s, turn == 2 ? p2 : p3), turn == 2 ? r2 : r3);
    save_session(s, store, "conv-1");
    // Exactly the blocks the manifest lists stay: the previous save's others were deleted. (A
    // block restored from the bank stays banked as well: equal content, one key.)
    const std::string v = server.command({"GET", server.keys("wm:snapshot-test:session:*").at(0)});
    ASSERT_GT(v.size(), 25u);
    const nlohmann::json manifest = nlohmann::json::parse(v.substr(25));  // "WMSESS1\n", 16 hex digits, "\n"
    std::set<std::string> listed, present;
    for (const char* part : {"window", "bank"})
      for (const auto& e : manifest.at(part)) listed.insert(e.at(1).get<std::string>());
    for (const auto& k : server.keys("wm:snapshot-test:c:*"))
      if (k.compare(k.size() - 2, 2, ":m") != 0) present.insert(k);
    EXPECT_EQ(present, listed) << "turn " << turn;
    EXPECT_GE(listed.size(), s.memory().bank().size());
  }
  RemoteStore store(rc);
  // A block gone: the session is reported lost, never used half.
  const std::vector<std::string> blocks = server.keys("wm:snapshot-test:c:*");
  std::string victim;
  for (const auto& k : blocks)
    if (k.size() < 2 || k.compare(k.size() - 2, 2, ":m") != 0) victim = k;
  ASSERT_FALSE(victim.empty());
  server.command({"DEL", victim});
  LlmSession s(m, tok, at::kCPU, at::kFloat, evoke_options("hidden"));
  EXPECT_THROW(load_session(s, store, "conv-1"), LostData);
  EXPECT_EQ(s.window().size(0), 0);
  // A damaged manifest.
  const std::string manifest = server.keys("wm:snapshot-test:session:*").at(0);
  server.command({"SETRANGE", manifest, "30", "#"});
  EXPECT_THROW(load_session(s, store, "conv-1"), CorruptData);
  // Erased: gone, manifest and blocks.
  EXPECT_TRUE(erase_session(store, "conv-1"));
  EXPECT_FALSE(load_session(s, store, "conv-1"));
  // The store unreachable: loading is an error, not a fresh conversation.
  server.kill();
  RemoteStore down(rc);
  EXPECT_THROW(load_session(s, down, "conv-1"), Error);
  EXPECT_THROW(save_session(ref, down, "conv-2"), Error);
}

}  // namespace
}  // namespace wm::llm
