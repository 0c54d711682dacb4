#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "llmkv/byte_level.h"
#include "llmkv/model.h"
#include "llmkv/session.h"
#include "llmkv/tokenizer.h"
#include "llm_test_util.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/temp_dir.h"
#include "tools/cli/npy.h"

namespace wm::llm {
namespace {

namespace fs = std::filesystem;

Tokenizer fixture_tokenizer() {
  return Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json");
}

LlmModel random_model(int64_t vocab, uint64_t seed) { return test::random_model(vocab, seed, 64); }

// Greedy continuation by recomputing the whole sequence at every step.
std::vector<int64_t> greedy_by_recompute(LlmModelImpl& m, std::vector<int64_t> seq, int n) {
  torch::NoGradGuard ng;
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    const int64_t t = m.forward_train(at::tensor(seq, at::kLong).unsqueeze(0))[0][-1].argmax().item<int64_t>();
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

TEST(LlmSession, GreedyGenerationEqualsRecomputation) {
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = random_model(tok.vocab_size(), 3);
  SessionOptions so;
  so.prefill_chunk = 5;  // a prompt of several chunks
  LlmSession s(m, tok, at::kCPU, at::kFloat, so);
  const std::vector<int64_t> prompt = tok.encode("Recall fada: 3117\nRecall piti:");
  GenerateOptions go;
  go.max_new_tokens = 10;
  Generation g = s.generate(prompt, go);
  EXPECT_EQ(g.tokens, greedy_by_recompute(*m, prompt, 10));
  EXPECT_EQ(g.stop_reason, "max_tokens");
  EXPECT_EQ(g.text, utf8_valid(tok.decode(g.tokens)));  // the text is valid UTF-8
  EXPECT_EQ(g.stats.prompt_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(g.stats.new_tokens, 10);
  // The last generated token is pending: the context holds prompt + 9 tokens.
  EXPECT_EQ(s.window().size(0), static_cast<int64_t>(prompt.size()) + 9);
  EXPECT_EQ(s.next_position(), static_cast<int64_t>(prompt.size()) + 10);
  EXPECT_EQ(g.prompt_logits.sizes(), (at::IntArrayRef{tok.vocab_size()}));
}

TEST(LlmSession, ContextAfterTurnsEqualsOnePass) {
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = random_model(tok.vocab_size(), 4);
  LlmSession s(m, tok, at::kCPU);
  const auto p1 = tok.encode("<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n");
  GenerateOptions go;
  go.max_new_tokens = 6;
  Generation g1 = s.generate(p1, go);
  const auto p2 = tok.encode("\n<|im_start|>user\nand now?<|im_end|>\n");
  s.feed(p2);
  std::vector<int64_t> all = p1;
  all.insert(all.end(), g1.tokens.begin(), g1.tokens.end());
  all.insert(all.end(), p2.begin(), p2.end());
  ASSERT_EQ(s.window().size(0), static_cast<int64_t>(all.size()));
  // One pass over the same tokens into a fresh window.
  torch::NoGradGuard ng;
  KvWindow w(m->kv_spec(at::kCPU), {"recent"});
  StepOptions st;
  m->step(at::tensor(all, at::kLong), at::arange(static_cast<int64_t>(all.size()), at::kLong), w, st);
  for (int l = 0; l < m->config().num_hidden_layers; ++l) {
    EXPECT_LT((s.window().k(l) - w.k(l)).abs().max().item<double>(), 1e-5) << l;
    EXPECT_LT((s.window().v(l) - w.v(l)).abs().max().item<double>(), 1e-5) << l;
    EXPECT_TRUE(at::equal(s.window().pos(l), w.pos(l))) << l;
  }
}

TEST(LlmSession, StopTokensAndStopStrings) {
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = random_model(tok.vocab_size(), 5);
  const auto prompt = tok.encode("Step 1:");
  GenerateOptions go;
  go.max_new_tokens = 12;
  const auto free_run = [&] {
    LlmSession s(m, tok, at::kCPU);
    return s.generate(prompt, go);
  }();
  ASSERT_EQ(free_run.tokens.size(), 12u);
  // Stop on the 4th generated token: it ends the generation and is not in the text.
  {
    GenerateOptions o = go;
    o.stop_tokens = {free_run.tokens[3]};
    LlmSession s(m, tok, at::kCPU);
    const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]);
    const size_t k = static_cast<size_t>(first - free_run.tokens.begin());
    Generation g = s.generate(prompt, o);
    EXPECT_EQ(g.stop_reason, "stop_token");
    EXPECT_EQ(g.tokens, std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + k + 1));
    EXPECT_EQ(g.text, tok.decode(std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + k)));
  }
  // A stop string taken from the middle of the free text: the text is cut before it.
  const std::string text = free_run.text;
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 2);
  GenerateOptions o = go;
  o.stop_strings = {stop};
  LlmSession s(m, tok, at::kCPU);
  std::string streamed;
  Generation g = s.generate(prompt, o, [&](const std::string& t) { streamed += t; });
  EXPECT_EQ(g.stop_reason, "stop_string");
  EXPECT_EQ(g.text, text.substr(0, text.find(stop)));
  EXPECT_EQ(streamed, g.text);
  // Bad input: an id outside the vocabulary.
  EXPECT_THROW(s.feed({tok.vocab_size()}), Error);
}

TEST(LlmSession, AFailedFeedChangesNothingAndGenerationFollowsAFeed) {
  const Tokenizer tok = fixture_tokenizer();
  LlmModel m = random_model(tok.vocab_size(), 6);
  LlmSession s(m, tok, at::kCPU);
  const auto prompt = tok.encode("Recall piti:");
  GenerateOptions go;
  go.max_new_tokens = 3;
  s.generate(prompt, go);  // ends with a pending token
  const int64_t size = s.window().size(0), next = s.next_position();
  EXPECT_THROW(s.feed({1, 2}, "no_such_region"), Error);
  EXPECT_THROW(s.feed({1, -1}), Error);
  EXPECT_EQ(s.window().size(0), size);
  EXPECT_EQ(s.next_position(), next);  // the pending token is still there
  // feed() then generate({}) continues from the fed context, as generate(ids) would.
  const auto more = tok.encode(" and fada:");
  s.feed(more);
  Generation a = s.generate({}, go);
  LlmSession t(m, tok, at::kCPU);
  t.generate(prompt, go);
  Generation b = t.generate(more, go);
  EXPECT_EQ(a.tokens, b.tokens);
  LlmSession u(m, tok, at::kCPU);
  EXPECT_THROW(u.generate({}, go), Error);
}

TEST(LlmSession, NpyFilesCarryShapeAndData) {
  const fs::path dir = wm::testing::make_temp_dir("wm_test_logits_");
  const std::string path = (dir / "wm_test_logits.npy").string();
  at::Tensor t = at::randn({3, 5});
  cli::save_npy(path, t);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  const size_t hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string header = bytes.substr(10, hlen);
  EXPECT_NE(header.find("'shape': (3, 5)"), std::string::npos) << header;
  EXPECT_NE(header.find("'<f4'"), std::string::npos);
  ASSERT_EQ(bytes.size(), 10 + hlen + 15 * sizeof(float));
  EXPECT_EQ(std::memcmp(bytes.data() + 10 + hlen, t.data_ptr<float>(), 15 * sizeof(float)), 0);
  EXPECT_NE(cli::npy_header({7}).find("'shape': (7,)"), std::string::npos);
  // An unwritable folder: an error, and nothing under the final name.
  EXPECT_THROW(cli::save_npy("/proc/wm_no/x.npy", t), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wm::llm
