// Continuous batching's decode step: LlmModel::step_batch over several sequences, each with its
// own window, against step() run for each sequence alone.
#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "llm_test_util.h"
#include "llmkv/model.h"
#include "llmkv/session.h"
#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/window.h"

namespace wm::llm {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace step_batch_test {

constexpr int64_t kVocab = 61;

KvWindow empty_window(const LlmModel& m) { return KvWindow(m->kv_spec(at::kCPU), {"system", "blocks", "recent"}); }

// Three sequences with prompts of 5, 9 and 14 tokens (the third's window selected per kv head,
// so that one sequence attends per head), decoded 4 steps: step_batch's logits, key masses and
// windows equal those of step() per sequence (1e-5), token by token.
TEST(StepBatch, EqualsEachSequenceSteppedAlone) {
  LlmModel m = test::random_model(kVocab, 3);
  const std::vector<int64_t> lens{5, 9, 14};
  const int64_t B = static_cast<int64_t>(lens.size());
  at::manual_seed(4);
  std::vector<KvWindow> alone, batched;
  std::vector<at::Tensor> prompts;
  for (int64_t b = 0; b < B; ++b) {
    prompts.push_back(at::randint(kVocab, {lens[b]}, at::kLong));
    alone.push_back(empty_window(m));
    batched.push_back(empty_window(m));
    const at::Tensor pos = at::arange(lens[b], at::kLong);
    m->step(prompts[b], pos, alone[b]);
    m->step(prompts[b], pos, batched[b]);
  }
  const int64_t KH = m->config().num_key_value_heads;
  std::vector<std::vector<int64_t>> keep(KH);
  for (int64_t h = 0; h < KH; ++h)
    for (int64_t i = 0; i < lens[2]; ++i)
      if ((i + h) % 3 != 0) keep[h].push_back(i);
  for (int l = 0; l < m->config().num_hidden_layers; ++l) {
    alone[2].keep_tokens_per_head(l, keep);
    batched[2].keep_tokens_per_head(l, keep);
  }
  StepOptions so;
  so.capture_mass = true;
  at::Tensor next = at::randint(kVocab, {B}, at::kLong);
  std::vector<int64_t> at_pos = lens;
  for (int step = 0; step < 4; ++step) {
    std::vector<KvWindow*> ws;
    for (auto& w : batched) ws.push_back(&w);
    const at::Tensor pos = at::tensor(at_pos, at::kLong);
    const std::vector<StepResult> got = m->step_batch(next, pos, ws, so);
    ASSERT_EQ(static_cast<int64_t>(got.size()), B);
    for (int64_t b = 0; b < B; ++b) {
      const StepResult want = m->step(next.narrow(0, b, 1), pos.narrow(0, b, 1), alone[b], so);
      EXPECT_LT((got[b].logits - want.logits).abs().max().item<double>(), 1e-5) << "step " << step << " seq " << b;
      ASSERT_EQ(got[b].key_mass.size(), want.key_mass.size());
      for (size_t l = 0; l < want.key_mass.size(); ++l)
        EXPECT_LT((got[b].key_mass[l] - want.key_mass[l]).abs().max().item<double>(), 1e-5);
      for (int l = 0; l < m->config().num_hidden_layers; ++l) {
        ASSERT_EQ(batched[b].size(l), alone[b].size(l));
        EXPECT_LT((batched[b].k(l) - alone[b].k(l)).abs().max().item<double>(), 1e-5);
        EXPECT_LT((batched[b].v(l) - alone[b].v(l)).abs().max().item<double>(), 1e-5);
      }
    }
    next = at::randint(kVocab, {B}, at::kLong);
    for (auto& p : at_pos) ++p;
  }
}

TEST(StepBatch, RefusesBadBatches) {
  LlmModel m = test::random_model(kVocab, 3);
  KvWindow a = empty_window(m), b = empty_window(m);
  const at::Tensor two = at::zeros({2}, at::kLong);
  EXPECT_THROW(m->step_batch(two, two, {&a, &a}), Error);                       // a shared window
  EXPECT_THROW(m->step_batch(two, at::zeros({3}, at::kLong), {&a, &b}), Error);  // positions
  EXPECT_THROW(m->step_batch(at::zeros({1}, at::kLong), two, {&a, &b}), Error);  // tokens
  EXPECT_THROW(m->step_batch(two, two, {}), Error);
  StepOptions all;
  all.all_logits = true;
  EXPECT_THROW(m->step_batch(two, two, {&a, &b}, all), Error);
  EXPECT_EQ(a.size(0), 0);  // nothing appended
}

// Generations advanced together (decode_together: one step_batch for all, continuous batching
// as a server runs it) give each session what its generate() gives alone: greedy and sampled,
// under different memory policies (per-head snapkv, per-head keepkv, full), with different
// limits, one joining after the others started (a new request at the next step) and the
// sessions' second turns too.
TEST(DecodeTogether, EachGenerationEqualsItsSessionAlone) {
  const Tokenizer tok =
      Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json");
  LlmModel m = test::random_model(tok.vocab_size(), 5, 64);
  struct Spec {
    std::string policy;
    int64_t budget;
    std::string prompt;
    int64_t max_new;
    double temperature;
  };
  const std::vector<Spec> specs = {{"full", 0, "Recall fada: 3117\nRecall piti:", 12, 0.0},
                                   {"snapkv", 12, "<|im_start|>user\nhello there, how are you<|im_end|>\n", 9, 0.0},
                                   {"keepkv", 16, "a b c d e f g h i j k l m n o p q r s", 14, 0.8},
                                   {"full", 0, "one more", 5, 0.7}};
  auto make = [&](const Spec& sp) {
    SessionOptions so;
    so.prefill_chunk = 8;
    so.memory.policy = sp.policy;
    so.memory.budget = sp.budget;
    so.memory.window = 4;
    return std::make_unique<LlmSession>(m, tok, at::kCPU, at::kFloat, so);
  };
  auto options = [&](const Spec& sp) {
    GenerateOptions go;
    go.max_new_tokens = sp.max_new;
    go.sampling.temperature = sp.temperature;
    go.sampling.seed = 42;
    return go;
  };
  // Alone: two turns each.
  std::vector<std::vector<int64_t>> want;
  for (const Spec& sp : specs) {
    auto s = make(sp);
    const Generation g1 = s->generate(tok.encode(sp.prompt), options(sp));
    const Generation g2 = s->generate(tok.encode(" and then?"), options(sp));
    std::vector<int64_t> both = g1.tokens;
    both.insert(both.end(), g2.tokens.begin(), g2.tokens.end());
    want.push_back(both);
  }
  // Together: the last session joins after two steps; each second turn starts when its first ends.
  std::vector<std::unique_ptr<LlmSession>> sessions;
  for (const Spec& sp : specs) sessions.push_back(make(sp));
  std::vector<std::optional<Decoding>> ds(specs.size());
  std::vector<std::vector<int64_t>> got(specs.size());
  std::vector<int> turn(specs.size(), 0);
  for (size_t i = 0; i + 1 < specs.size(); ++i) ds[i].emplace(sessions[i]->begin(tok.encode(specs[i].prompt), options(specs[i])));
  for (int step = 0; step < 200; ++step) {
    if (step == 2) ds.back().emplace(sessions.back()->begin(tok.encode(specs.back().prompt), options(specs.back())));
    bool any = false;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!ds[i] || !ds[i]->done()) continue;
      const Generation g = ds[i]->finish();
      got[i].insert(got[i].end(), g.tokens.begin(), g.tokens.end());
      ds[i].reset();
      if (++turn[i] == 1) ds[i].emplace(sessions[i]->begin(tok.encode(" and then?"), options(specs[i])));
    }
    std::vector<Decoding*> live;
    for (auto& d : ds)
      if (d && !d->done()) live.push_back(&*d), any = true;
    if (!any && step > 2) break;
    decode_together(live);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(turn[i], 2) << specs[i].policy;
    EXPECT_EQ(got[i], want[i]) << "session " << i << " (" << specs[i].policy << ")";
  }
}

}  // namespace step_batch_test
}  // namespace wm::llm
