// copy: a training aid, not one of the evaluated tasks. Rounds of a short list of mqar's pair
// lines ("simo 42"), then the same lines again, shuffled, as the target; as many rounds as the
// length holds. Every token of a repeat is a target that only looking back can predict, so the
// loss is dense where the tasks' answers are sparse, and the look-up-by-key circuit mqar needs
// forms on mqar's own tokens (a key at the start of a line, a value with its leading space).
// What did not work, on a 2M-parameter model: items on one line (" simo" is other tokens than a
// line's "simo"), lines repeated in order (copied by position, one after another, with no look-up
// by key), and one long shuffled list (a value among 40 candidates: no signal for the look-up to
// grow from). A round holds 2..8 lines, so a first guess among them is often right.
// A repeat spans several lines, so only a trainer scores it, teacher-forced.
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
  int64_t total = add_segment(s, count, "system", "system", "Copy each list.\n");
  const int64_t frame = count("List:\n") + count("Copy:\n");
  int rounds = 0, items = 0;
  while (true) {
    const int k = static_cast<int>(rng.uniform_int(2, 8));
    std::vector<std::string> lines;
    std::set<std::string> keys;
    int64_t cost = frame;
    while (static_cast<int>(lines.size()) < k) {
      const std::string& key = rng.pick(mqar_key_pool());
      if (!keys.insert(key).second) continue;  // keys distinct within a round
      lines.push_back(key + " " + std::to_string(rng.uniform_int(10, 99)) + "\n");
      cost += 2 * count(lines.back());
    }
    if (rounds > 0 && !closer_with(total, cost, o.target_tokens)) break;
    std::string list, repeat;
    for (const auto& l : lines) list += l;
    rng.shuffle(lines);
    for (const auto& l : lines) repeat += l;
    push_segment(s, str_cat("list:", rounds), "list", "List:\n" + list);
    push_segment(s, str_cat("cue:", rounds), "cue", "Copy:\n");
    push_segment(s, str_cat("cue:", rounds, ":answer"), "answer", repeat, true);
    total += cost;
    items += k;
    ++rounds;
  }
  s.meta = {{"rounds", rounds}, {"items", items}, {"tokens", total}, {"target_tokens", o.target_tokens}};
  return s;
}

}  // namespace wm::llmtasks
