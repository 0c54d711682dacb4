#include <gtest/gtest.h>

#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tools/llm_tasks/sample.h"
#include "tools/llm_train/data.h"

namespace wm::llmdata {
namespace {

// Tokenizing segment by segment (as training, evaluation and block-wise memory policies do)
// must give the ids of the whole text: otherwise segment boundaries leave marks in the ids
// (a lone space token before a needle) that the text itself does not have.
TEST(LlmTaskTokens, SegmentWiseIdsEqualWholeTextIds) {
  const auto tok =
      llm::Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json");
  for (const auto& task : llmtasks::task_names()) {
    for (uint64_t i = 0; i < 6; ++i) {
      llmtasks::GenOptions go;
      go.target_tokens = 600;
      go.count = token_counter(tok);
      const auto s = llmtasks::make_sample(task, llmtasks::training_seed(i), go);
      const TokenizedSample t = tokenize(s, tok);
      EXPECT_EQ(t.ids, tok.encode(s.text(), true)) << task << " seed " << i;
      // Answers are marked where their segments are, and cover exactly the target tokens.
      int64_t marked = 0;
      for (auto [b, e] : t.answers) marked += e - b;
      int64_t flagged = 0;
      for (auto f : t.target) flagged += f;
      EXPECT_EQ(marked, flagged) << task;
      EXPECT_FALSE(t.answers.empty()) << task;
    }
  }
}

TEST(LlmTaskTokens, AnswerScoringIsGreedyExactMatch) {
  // ids: 5 [7 8 9]; argmax[i] predicts ids[i + 1].
  const std::vector<int64_t> ids = {5, 7, 8, 9};
  EXPECT_TRUE(answer_correct(ids, {7, 8, 9, 0}, {1, 4}));
  EXPECT_FALSE(answer_correct(ids, {7, 8, 1, 0}, {1, 4}));
  EXPECT_FALSE(answer_correct(ids, {2, 8, 9, 0}, {1, 4}));
  EXPECT_TRUE(answer_correct(ids, {2, 8, 9, 0}, {2, 4}));
  EXPECT_THROW(answer_correct(ids, {7, 8, 9, 0}, {0, 4}), wm::Error);
  EXPECT_THROW(answer_correct(ids, {7, 8, 9, 0}, {1, 5}), wm::Error);
}

}  // namespace
}  // namespace wm::llmdata
