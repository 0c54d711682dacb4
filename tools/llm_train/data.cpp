#include "tools/llm_train/data.h"

#include "runtime/error.h"

namespace wm::llmdata {

TokenizedSample tokenize(const llmtasks::Sample& s, const llm::Tokenizer& tok) {
  TokenizedSample t;
  t.task = s.task;
  t.seed = s.seed;
  for (const auto& seg : s.segments) {
    const std::vector<int64_t> ids = tok.encode(seg.text, true);
    const int64_t begin = static_cast<int64_t>(t.ids.size());
    t.ids.insert(t.ids.end(), ids.begin(), ids.end());
    t.target.insert(t.target.end(), ids.size(), seg.target ? 1 : 0);
    const int64_t end = static_cast<int64_t>(t.ids.size());
    t.segment_spans.push_back({begin, end});
    if (seg.target && end > begin) t.answers.push_back({begin, end});
  }
  return t;
}

llmtasks::TokenCounter token_counter(const llm::Tokenizer& tok) {
  return [&tok](const std::string& text) { return static_cast<int64_t>(tok.encode(text, true).size()); };
}

bool answer_correct(const std::vector<int64_t>& ids, const std::vector<int64_t>& logits_argmax,
                    std::pair<int64_t, int64_t> answer) {
  WM_CHECK(answer.first >= 1 && answer.second <= static_cast<int64_t>(ids.size()) && answer.first < answer.second,
           "answer span [", answer.first, ", ", answer.second, ") does not fit ", ids.size(), " tokens");
  WM_CHECK(static_cast<int64_t>(logits_argmax.size()) >= answer.second - 1, "too few argmax entries");
  for (int64_t i = answer.first; i < answer.second; ++i)
    if (logits_argmax[i - 1] != ids[i]) return false;
  return true;
}

}  // namespace wm::llmdata
