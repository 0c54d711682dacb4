// copy: a training aid, not one of the evaluated tasks. A list of mqar's pair lines ("simo 42"),
// then the same lines again, shuffled, as the target. Every token of the repeat is a target that only
// looking back can predict, so the loss is dense where the tasks' answers are sparse, and the
// look-up-and-copy circuit (an induction head) forms early in training on the very tokens mqar
// asks about: a key at the start of a line and a value with its leading space. (With items on one
// line, " simo" is other tokens than a line's "simo": a model learned that copy in 300 steps and
// mqar not at all. Repeated in order, the lines can be copied by position, one after another, and
// a model that copied them perfectly still could not recall a single mqar value: shuffled, each
// value can only be found by its key.) The target spans several lines, so only a trainer scores
// it, teacher-forced.
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
  total += count("List:\n") + count("Copy:\n");
  std::vector<std::string> lines;
  int n = 0;
  while (true) {
    const std::string line = rng.pick(mqar_key_pool()) + " " + std::to_string(rng.uniform_int(10, 99)) + "\n";
    const int64_t c = 2 * count(line);  // once in the list, once in the answer
    if (n > 0 && !closer_with(total, c, o.target_tokens)) break;
    lines.push_back(line);
    total += c;
    ++n;
  }
  std::string list, repeat;
  for (const auto& l : lines) list += l;
  rng.shuffle(lines);
  for (const auto& l : lines) repeat += l;
  push_segment(s, "list", "list", "List:\n" + list);
  push_segment(s, "cue", "cue", "Copy:\n");
  push_segment(s, "cue:answer", "answer", repeat, true);
  s.meta = {{"items", n}, {"tokens", total}, {"target_tokens", o.target_tokens}};
  return s;
}

}  // namespace wm::llmtasks
