// recall: a training aid, not one of the evaluated tasks. mqar in its shortest form: 2..8 pair
// lines with nothing before them, "Recall:\n", then every key queried once, in a shuffled order.
// The length does not follow GenOptions::target_tokens (a sample is 6 x pairs + 3 tokens or so).
// Why it exists: on associative recall in miniature (tools/llm_train/miniature_recall.py), a
// 2-layer decoder learns the look-up in ~800 steps on bare lists, but a 20-token line before every
// list (mqar's instruction is about that long) stalls it past 2,500 steps; trained on bare lists
// first (or beside them), the look-up it forms there carries over to the prefixed form.
#include <set>

#include "runtime/error.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

Sample make_recall(uint64_t seed, const GenOptions& o) {
  check_common(o, "recall");
  if (o.mqar_pairs < 0 || o.mqar_pairs > kMqarKeyPool)
    throw Error(str_cat("recall: pairs must be in [0, ", kMqarKeyPool, "], got ", o.mqar_pairs));
  const TokenCounter count = counter_of(o);
  Rng rng(hash_combine(seed, hash_string("recall")));
  Sample s;
  s.task = "recall";
  s.seed = seed;
  const int n = o.mqar_pairs > 0 ? o.mqar_pairs : static_cast<int>(rng.uniform_int(2, 8));
  std::vector<std::string> keys, values;
  std::set<std::string> used;
  while (static_cast<int>(keys.size()) < n) {
    const std::string& k = rng.pick(mqar_key_pool());
    if (!used.insert(k).second) continue;  // keys distinct within a sample
    keys.push_back(k);
    values.push_back(std::to_string(rng.uniform_int(10, 99)));
  }
  int64_t total = 0;
  for (int i = 0; i < n; ++i)
    total += add_segment(s, count, str_cat("kv:", i), "pair", keys[i] + " " + values[i] + "\n");
  total += add_segment(s, count, "recall", "query_header", "Recall:\n");
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  rng.shuffle(order);
  for (int j = 0; j < n; ++j) {
    const int i = order[j];
    total += add_segment(s, count, str_cat("query:", j), "query", keys[i]);
    total += add_segment(s, count, str_cat("query:", j, ":answer"), "answer", " " + values[i] + "\n", true);
  }
  s.meta = {{"pairs", n}, {"queries", n}, {"tokens", total}, {"target_tokens", o.target_tokens}};
  return s;
}

}  // namespace wm::llmtasks
