// A plan-house memory of real prose: the house's lines with handbook paragraphs between them
// (plan_memory.h).
#include "tools/llm_tasks/plan_memory.h"

#include "runtime/error.h"
#include "tools/llm_tasks/rng.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

ProseNotes make_prose_notes(uint64_t seed, int64_t budget, const TokenCounter& count, const ProseCorpus& corpus) {
  ProseNotes notes;
  notes.split = prose_split_of(seed);
  const std::vector<std::string>& paras = corpus.paragraphs(notes.split);
  WM_CHECK(!paras.empty(), "the ", prose_split_name(notes.split), " split of ", corpus.source(), " has no paragraph");
  Rng rng(hash_combine(seed, hash_string("plan_notes")));
  notes.first = rng.index(paras.size());
  for (size_t k = 0; k < paras.size(); ++k) {
    const std::string& p = paras[(notes.first + k) % paras.size()];
    const int64_t t = count(p + "\n");
    if (!detail::closer_with(notes.tokens, t, budget)) break;
    notes.tokens += t;
    notes.paragraphs.push_back(p);
  }
  return notes;
}

std::vector<Segment> memory_with_notes(const std::vector<Segment>& house, const ProseNotes& notes) {
  const size_t h = house.size(), n = notes.paragraphs.size();
  if (n == 0) return house;
  WM_CHECK(h > 0, "expected house lines to place ", n, " notes after, got none");
  std::vector<Segment> out;
  out.reserve(h + n);
  size_t k = 0;
  for (size_t i = 0; i < h; ++i) {
    out.push_back(house[i]);
    for (; k < n && k * h / n == i; ++k)
      out.push_back(Segment{str_cat("note:", k), "note", notes.paragraphs[k] + "\n", false});
  }
  return out;
}

}  // namespace wm::llmtasks
