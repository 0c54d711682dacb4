// mqar: multi-query associative recall. Distinct keys with 2-digit values, one pair per line, then
// queries for a random subset of the keys in random order. Keys come from a fixed pool of
// two-syllable pseudo-words, so that a byte-level BPE trained on the tasks' text learns most of
// them as single tokens and a value (" 42" under GPT-2-style splitting) is one token too. A pair
// is "simo 42" and a query is the key alone ("simo", answered " 42"): the value follows its key
// directly in both places, as in the associative recall of the literature. (With "simo: 42" the
// query's last token is the colon every pair shares, and recall needs a match on the token before
// it; with multi-token keys and one token per digit, a conjunction over syllables and digits. A
// 2M-parameter model on a CPU budget learned neither in 400-3,000 steps; it learns this one.)
#include <algorithm>

#include "runtime/error.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

const std::vector<std::string>& mqar_key_pool() {
  static const std::vector<std::string> pool = [] {
    std::vector<std::string> all;
    for (const std::string& a : syllables())
      for (const std::string& b : syllables()) all.push_back(a + b);
    Rng rng(hash_string("mqar key pool"));
    rng.shuffle(all);
    all.resize(kMqarKeyPool);
    return all;
  }();
  return pool;
}

namespace {

int default_queries(const GenOptions& o, int pairs) {
  if (pairs <= 0) return 0;
  if (o.mqar_queries > 0) return std::min(o.mqar_queries, pairs);
  return std::clamp(pairs / 2, 1, 64);
}

}  // namespace

Sample make_mqar(uint64_t seed, const GenOptions& o) {
  check_common(o, "mqar");
  if (o.mqar_pairs < 0 || o.mqar_queries < 0)
    throw Error(str_cat("mqar: pairs and queries must be >= 0, got ", o.mqar_pairs, " and ", o.mqar_queries));
  if (o.mqar_pairs > kMqarKeyPool)
    throw Error(str_cat("mqar: at most ", kMqarKeyPool, " pairs (the key pool), got ", o.mqar_pairs));
  if (o.mqar_pairs > 0 && o.mqar_queries > o.mqar_pairs)
    throw Error(str_cat("mqar: ", o.mqar_queries, " queries need at least as many pairs, got ", o.mqar_pairs));
  const TokenCounter count = counter_of(o);
  const int64_t target = o.target_tokens;
  Rng rng(hash_combine(seed, hash_string("mqar")));

  Sample s;
  s.task = "mqar";
  s.seed = seed;
  int64_t total = add_segment(s, count, "system", "system",
                              "Each line pairs a code word with a number. After Recall, give the number of "
                              "each code word listed.\n");

  // Candidate pairs with their costs; a query's cost is its cue plus its answer.
  std::vector<std::string> keys, values, pair_text;
  std::vector<int64_t> pair_cost, query_cost;
  std::set<std::string> used_keys;
  auto grow = [&] {
    std::string k = rng.pick(mqar_key_pool());
    while (!used_keys.insert(k).second) k = rng.pick(mqar_key_pool());
    std::string v = std::to_string(rng.uniform_int(10, 99));
    pair_text.push_back(k + " " + v + "\n");
    pair_cost.push_back(count(pair_text.back()));
    query_cost.push_back(count(k) + count(" " + v + "\n"));
    keys.push_back(std::move(k));
    values.push_back(std::move(v));
  };

  int n = 0;
  int64_t pairs_sum = 0, queries_sum = 0;
  if (o.mqar_pairs > 0) {
    for (; n < o.mqar_pairs; ++n) {
      grow();
      pairs_sum += pair_cost.back();
    }
  } else {
    // Grow while the estimate (pairs + expected query cost) comes closer to the target.
    auto estimate = [&](int m, int64_t p, int64_t q) {
      return m == 0 ? total : total + p + default_queries(o, m) * q / m;
    };
    while (n < kMqarKeyPool) {
      grow();
      int64_t p = pairs_sum + pair_cost.back(), q = queries_sum + query_cost.back();
      int64_t before = estimate(n, pairs_sum, queries_sum), after = estimate(n + 1, p, q);
      if (n > 0 && !closer_with(before, after - before, target)) break;
      pairs_sum = p;
      queries_sum = q;
      ++n;
    }
  }
  total += pairs_sum;

  const int nq = default_queries(o, n);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  rng.shuffle(order);
  order.resize(nq);  // the queried keys, in query order
  int64_t queries_total = 0;
  for (int i : order) queries_total += query_cost[i];

  for (int i = 0; i < n; ++i) push_segment(s, str_cat("kv:", i), "pair", pair_text[i]);
  if (o.mqar_pairs > 0 || n == kMqarKeyPool) {
    std::vector<std::string> avoid(values.begin(), values.begin() + n);
    std::vector<FillerUnit> filler = make_filler(rng, count, target - total - queries_total, avoid);
    int next_id = 0;
    total += add_filler_segments(s, count, filler, 0, filler.size(), &next_id);
  }
  // A query repeats its key at the start of a line, as the pair did: the key's tokens are the
  // same in both places (a word after a space tokenizes otherwise than one after a newline).
  if (nq > 0) total += add_segment(s, count, "recall", "query_header", "Recall:\n");
  for (int j = 0; j < nq; ++j) {
    int i = order[j];
    push_segment(s, str_cat("query:", j), "query", keys[i]);
    push_segment(s, str_cat("query:", j, ":answer"), "answer", " " + values[i] + "\n", true);
  }
  total += queries_total;

  s.meta = {{"pairs", n}, {"queries", nq}, {"tokens", total}, {"target_tokens", target}};
  return s;
}

}  // namespace wm::llmtasks
