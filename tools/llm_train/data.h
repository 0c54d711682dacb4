#pragma once
// Samples of the text tasks as token ids with the answer tokens marked: what the LLM trainer
// learns from and the evaluator scores. Each segment is tokenized on its own and the ids are
// concatenated, so a segment boundary is a token boundary (the same ids in training, in
// evaluation and when a memory policy feeds segments as blocks).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "llmkv/tokenizer.h"
#include "tools/llm_tasks/sample.h"

namespace wm::llmdata {

struct TokenizedSample {
  std::string task;
  uint64_t seed = 0;
  std::vector<int64_t> ids;
  std::vector<uint8_t> target;                             // 1 on answer tokens
  std::vector<std::pair<int64_t, int64_t>> answers;        // [begin, end) of each answer's tokens
  std::vector<std::pair<int64_t, int64_t>> segment_spans;  // [begin, end) of each segment's tokens
};

// Tokenizes every segment (special tokens such as <|im_start|> are matched).
TokenizedSample tokenize(const llmtasks::Sample& s, const llm::Tokenizer& tok);

// A token counter over the tokenizer, for the generators' length targets.
llmtasks::TokenCounter token_counter(const llm::Tokenizer& tok);

// One answer scored from the logits of a teacher-forced pass: correct when, at every answer
// token, the most probable token (lowest id among ties) is that token: exactly when greedy
// decoding from the text before the answer reproduces the answer.
// logits_argmax[i] is the argmax of the logits at position i (predicting token i + 1).
bool answer_correct(const std::vector<int64_t>& ids, const std::vector<int64_t>& logits_argmax,
                    std::pair<int64_t, int64_t> answer);

}  // namespace wm::llmdata
