// copy: a training aid, not one of the evaluated tasks. A list of items (mqar's key words and
// 2-digit numbers), then the same list again as the answer. Every token of the repeat is a target
// that only looking back can predict, so the loss is dense where the tasks' answers are sparse:
// the look-up-and-copy circuit the tasks need (an induction head) forms early in training.
#include "runtime/error.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

Sample make_copy(uint64_t seed, const GenOptions& o) {
  check_common(o, "copy");
  const TokenCounter count = counter_of(o);
  Rng rng(hash_combine(seed, hash_string("copy")));
  Sample s;
  s.task = "copy";
  s.seed = seed;
  int64_t total = add_segment(s, count, "system", "system", "Copy the list.\n");
  total += count("List:\n") + count("Copy:") + count("\n");
  std::string items;
  int n = 0;
  while (true) {
    const std::string item = " " + (rng.index(2) == 0 ? rng.pick(mqar_key_pool())
                                                      : std::to_string(rng.uniform_int(10, 99)));
    const int64_t c = 2 * count(item);  // once in the list, once in the answer
    if (n > 0 && !closer_with(total, c, o.target_tokens)) break;
    items += item;
    total += c;
    ++n;
  }
  push_segment(s, "list", "list", "List:" + items + "\n");
  push_segment(s, "cue", "cue", "Copy:");
  push_segment(s, "cue:answer", "answer", items + "\n", true);
  s.meta = {{"items", n}, {"tokens", total}, {"target_tokens", o.target_tokens}};
  return s;
}

}  // namespace wm::llmtasks
