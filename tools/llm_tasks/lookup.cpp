// lookup: a training aid, not one of the evaluated tasks. The recall aid with values of several
// tokens: 2..8 lines "key value" (keys from mqar's pool), "Recall:\n", then every key queried once
// in a shuffled order. Values are what the other tasks ask for: numbers of 3 or 4 digits (niah's
// secret codes, multifact's lockers and rooms), pet and person names, capitalised pseudo-words
// (multifact's cities) and colours, each a sequence of 1..4 tokens for a byte-level BPE.
// Why it exists: a model trained on mqar alone (whose values are 2-digit numbers, one token each)
// finds the right needle in niah and writes the first token of its code (" 69"), then guesses
// the digits after it ("8", "8"): continuing a value by copying the token that followed its
// previous token there is a second look-up, keyed by number and name pieces, that mqar never
// asks for. Here every answer but the shortest needs it.
#include <set>

#include "runtime/error.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

namespace {

std::string draw_value(Rng& rng, std::set<std::string>& used) {
  for (;;) {
    std::string v;
    switch (rng.uniform_int(0, 5)) {
      case 0: v = std::to_string(rng.uniform_int(1000, 9999)); break;
      case 1: v = std::to_string(rng.uniform_int(100, 999)); break;
      case 2: v = rng.pick(pet_names()); break;
      case 3: v = rng.pick(person_names()); break;
      case 4: v = capitalize(pseudo_word(rng)); break;
      default: v = rng.pick(colours()); break;
    }
    if (used.insert(v).second) return v;  // values distinct within a sample
  }
}

}  // namespace

Sample make_lookup(uint64_t seed, const GenOptions& o) {
  check_common(o, "lookup");
  if (o.mqar_pairs < 0 || o.mqar_pairs > kMqarKeyPool)
    throw Error(str_cat("lookup: pairs must be in [0, ", kMqarKeyPool, "], got ", o.mqar_pairs));
  const TokenCounter count = counter_of(o);
  Rng rng(hash_combine(seed, hash_string("lookup")));
  Sample s;
  s.task = "lookup";
  s.seed = seed;
  const int n = o.mqar_pairs > 0 ? o.mqar_pairs : static_cast<int>(rng.uniform_int(2, 8));
  std::vector<std::string> keys, values;
  std::set<std::string> used_keys, used_values;
  while (static_cast<int>(keys.size()) < n) {
    const std::string& k = rng.pick(mqar_key_pool());
    if (!used_keys.insert(k).second) continue;  // keys distinct within a sample
    keys.push_back(k);
    values.push_back(draw_value(rng, used_values));
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
