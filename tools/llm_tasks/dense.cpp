// needles and facts: training aids, not evaluated tasks. niah and multifact with as many needles
// or facts as the length holds (2 at least, up to 5 needles or 8 facts), where the tasks
// themselves plant one per 128 tokens: a needle in a short text is then found by its form alone
// ("the secret code of the ... is"), and telling several apart by their subjects is what a model
// trained on the tasks alone fails at (the embedded model: one needle at 128 tokens 100%, one or
// two at 256 tokens 46%). Here every sample asks it.
#include <algorithm>

#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

// A needle costs about 16 tokens, its question and answer about 20; a fact exchange and its
// probe about 40 (the embedded tokenizer's counts): the most that fit beside some filler.
Sample make_needles(uint64_t seed, const GenOptions& o) {
  GenOptions g = o;
  Rng rng(hash_combine(seed, hash_string("needles")));
  const int most = static_cast<int>(std::clamp<int64_t>((o.target_tokens - 16) / 40, 2, 5));
  g.niah_needles = static_cast<int>(rng.uniform_int(2, most));
  g.niah_depths.clear();
  Sample s = make_niah(seed, g);
  s.task = "needles";
  return s;
}

Sample make_facts(uint64_t seed, const GenOptions& o) {
  GenOptions g = o;
  Rng rng(hash_combine(seed, hash_string("facts")));
  const int most = static_cast<int>(std::clamp<int64_t>((o.target_tokens - 24) / 48, 2, 8));
  g.multifact_facts = static_cast<int>(rng.uniform_int(2, most));
  Sample s = make_multifact(seed, g);
  s.task = "facts";
  return s;
}

}  // namespace wm::llmtasks
