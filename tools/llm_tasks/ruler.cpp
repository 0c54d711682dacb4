// The prose tasks (sample.h: prose_niah, prose_multikey, prose_multivalue, prose_vartrack,
// prose_qa): RULER's needle, multi-key, multi-value and variable-tracking tasks and a one-fact
// question, over haystacks of real prose (prose.h), in one user message of the model's chat
// format. Each task states its needles and question (a ProsePlan); build_prose() cuts the
// haystack, places the needles and lays out the segments.
#include <algorithm>
#include <cctype>

#include "runtime/error.h"
#include "tools/llm_tasks/prose.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

namespace {

const std::vector<std::string> kKeyAdjectives = {
    "quiet",  "amber",  "brave",  "calm",   "dusty",  "eager",  "fuzzy", "gentle", "hollow", "icy",
    "jolly",  "keen",   "lively", "mellow", "nimble", "odd",    "proud", "rapid",  "rusty",  "shy",
    "silent", "tidy",   "vivid",  "wary",   "wild",   "zesty",  "bold",  "crisp",  "faint",  "lucky"};
const std::vector<std::string> kKeyNouns = {
    "lantern", "harbor", "meadow", "falcon", "pebble", "orchard", "violin", "compass", "glacier", "beacon",
    "canyon",  "thistle", "walrus", "quarry", "saddle", "tunnel",  "marble", "ribbon",  "hammock", "lagoon",
    "cactus",  "ferry",   "goblet", "igloo",  "jigsaw", "kettle",  "ladder", "mitten",  "nutmeg",  "otter"};
// Word values for prose_niah: everyday nouns, one word each.
const std::vector<std::string> kValueWords = {
    "apple",   "bicycle", "candle", "dolphin", "envelope", "feather", "giraffe", "helmet", "island",  "jacket",
    "kitten",  "lemon",   "magnet", "napkin",  "onion",    "parrot",  "pumpkin", "rabbit", "sandwich", "teapot",
    "umbrella", "volcano", "whistle", "yogurt", "zebra",   "anchor",  "biscuit", "carrot", "donkey",  "garlic"};

// The seed's index (the held-out bit cleared): what spreads depths evenly over consecutive samples.
uint64_t seed_index(uint64_t seed) { return seed & ~kHeldoutBit; }

// Depths 0, 0.1, ..., 1 in turn over consecutive seed indices.
double cycled_depth(uint64_t seed) { return static_cast<double>(seed_index(seed) % 11) / 10.0; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string make_key(Rng& rng) { return rng.pick(kKeyAdjectives) + "-" + rng.pick(kKeyNouns); }

// A fact or needle and where it goes: depth in [0, 1] of the haystack's tokens.
struct PlacedNeedle {
  std::string text;
  double depth = 0.0;
};

// What a task puts around the haystack. answers are written " <answer>", "," between them.
struct ProsePlan {
  std::string task, instruction, question, answer_prefix;
  std::vector<PlacedNeedle> needles;  // in the order they must appear (depths non-decreasing)
  std::vector<std::string> answers;
  std::vector<std::string> avoid;     // no haystack paragraph contains one of these (case-insensitive)
  nlohmann::json meta = nlohmann::json::object();
};

// Consecutive paragraphs of the split from a random start, wrapping at most once, skipping those
// that contain an avoided string; the total closest to budget (closer_with). The index of the
// first paragraph goes to *first.
std::vector<FillerUnit> prose_haystack(Rng& rng, const std::vector<std::string>& paras, const TokenCounter& count,
                                       int64_t budget, const std::vector<std::string>& avoid, size_t* first) {
  std::vector<std::string> banned;
  for (const auto& a : avoid) banned.push_back(lower(a));
  std::vector<FillerUnit> out;
  *first = rng.index(paras.size());
  int64_t total = 0;
  for (size_t k = 0; k < paras.size(); ++k) {
    const std::string& p = paras[(*first + k) % paras.size()];
    const std::string low = lower(p);
    bool skip = false;
    for (const auto& b : banned) skip = skip || low.find(b) != std::string::npos;
    if (skip) continue;
    FillerUnit u{p + "\n\n", 0, true};
    u.tokens = count(u.text);
    if (!closer_with(total, u.tokens, budget)) break;
    total += u.tokens;
    out.push_back(std::move(u));
  }
  return out;
}

// Needle i goes before haystack unit at[i]: the first unit where the tokens before it reach
// depth * total (at == size: after the last paragraph).
std::vector<size_t> needle_positions(const std::vector<FillerUnit>& units, const std::vector<PlacedNeedle>& needles) {
  int64_t total = 0;
  for (const auto& u : units) total += u.tokens;
  std::vector<size_t> at;
  for (const auto& n : needles) {
    const double want = n.depth * static_cast<double>(total);
    size_t k = 0;
    int64_t before = 0;
    while (k < units.size() && static_cast<double>(before) + 0.5 * units[k].tokens <= want) before += units[k++].tokens;
    at.push_back(at.empty() ? k : std::max(k, at.back()));
  }
  return at;
}

Sample build_prose(uint64_t seed, const GenOptions& o, Rng& rng, const ProsePlan& plan) {
  check_common(o, plan.task.c_str());
  const TokenCounter count = counter_of(o);
  const std::shared_ptr<const ProseCorpus> corpus = o.prose ? o.prose : default_prose_corpus();
  const ProseSplit split = prose_split_of(seed);
  const std::string system = o.chat.before_user + plan.instruction + "\n\n";
  const std::string question = plan.question + o.chat.after_user + plan.answer_prefix;
  int64_t fixed = count(system) + count(question);
  for (const auto& n : plan.needles) fixed += count(n.text + "\n\n");
  for (size_t i = 0; i < plan.answers.size(); ++i) fixed += count(" " + plan.answers[i]) + (i ? count(",") : 0);
  std::vector<std::string> avoid = plan.avoid;
  avoid.insert(avoid.end(), plan.answers.begin(), plan.answers.end());
  size_t first = 0;
  const std::vector<FillerUnit> units =
      prose_haystack(rng, corpus->paragraphs(split), count, o.target_tokens - fixed, avoid, &first);
  const std::vector<size_t> at = needle_positions(units, plan.needles);

  Sample s;
  s.task = plan.task;
  s.seed = seed;
  int64_t total = add_segment(s, count, "system", "system", system);
  size_t next = 0;
  nlohmann::json placed = nlohmann::json::array();
  for (size_t u = 0; u <= units.size(); ++u) {
    for (; next < at.size() && at[next] == u; ++next) {
      total += add_segment(s, count, str_cat("needle:", next), "needle", plan.needles[next].text + "\n\n");
      placed.push_back({{"depth", plan.needles[next].depth}, {"before_paragraph", u}});
    }
    if (u < units.size()) {
      push_segment(s, str_cat("filler:", u), "filler", units[u].text);
      total += units[u].tokens;
    }
  }
  total += add_segment(s, count, "question", "query", question);
  for (size_t i = 0; i < plan.answers.size(); ++i) {
    if (i) total += add_segment(s, count, str_cat("question:sep:", i), "cue", ",");
    total += add_segment(s, count, str_cat("question:answer:", i), "answer", " " + plan.answers[i], true);
  }
  s.meta = plan.meta;
  s.meta["split"] = prose_split_name(split);
  s.meta["source"] = corpus->source();
  s.meta["first_paragraph"] = first;
  s.meta["paragraphs"] = units.size();
  s.meta["needles"] = placed;
  s.meta["answers"] = plan.answers;
  s.meta["tokens"] = total;
  s.meta["target_tokens"] = o.target_tokens;
  return s;
}

// Needle depths: one cycled (the asked needle's, or niah_depths[0]), the others uniform; sorted.
std::vector<double> spread_depths(Rng& rng, uint64_t seed, size_t n, const GenOptions& o) {
  std::vector<double> d;
  d.push_back(o.niah_depths.empty() ? cycled_depth(seed) : o.niah_depths.front());
  if (!(d[0] >= 0.0 && d[0] <= 1.0)) throw Error(str_cat("prose tasks: depth ", d[0], " is not in [0, 1]"));
  while (d.size() < n) d.push_back(rng.uniform());
  return d;
}

std::string magic_needle(const std::string& kind, const std::string& key, const std::string& value) {
  return str_cat("One of the special magic ", kind, "s for ", key, " is: ", value, ".");
}

std::string magic_instruction(const std::string& kind) {
  return str_cat("Some special magic ", kind, "s are hidden within the following text. Make sure to memorize it. ",
                 "I will quiz you about the ", kind, "s afterwards.");
}

// Distinct 7-digit numbers.
std::vector<std::string> magic_numbers(Rng& rng, size_t n) {
  std::set<std::string> used;
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(fresh_number(rng, 1000000, 9999999, used));
  return out;
}

// Distinct keys.
std::vector<std::string> magic_keys(Rng& rng, size_t n) {
  std::vector<std::string> out;
  while (out.size() < n) {
    std::string k = make_key(rng);
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  return out;
}

}  // namespace

Sample make_prose_niah(uint64_t seed, const GenOptions& o) {
  Rng rng(hash_combine(seed, hash_string("prose_niah")));
  const bool word = seed_index(seed) % 2 == 1;
  const std::string kind = word ? "word" : "number";
  const std::string key = make_key(rng);
  const std::string value = word ? rng.pick(kValueWords) : magic_numbers(rng, 1)[0];
  ProsePlan p;
  p.task = "prose_niah";
  p.instruction = magic_instruction(kind);
  p.needles = {{magic_needle(kind, key, value), spread_depths(rng, seed, 1, o)[0]}};
  p.question = str_cat("What is the special magic ", kind, " for ", key, " mentioned in the provided text?");
  p.answer_prefix = str_cat("The special magic ", kind, " for ", key, " mentioned in the provided text is:");
  p.answers = {value};
  p.avoid = {key};
  p.meta = {{"key", key}, {"kind", kind}};
  return build_prose(seed, o, rng, p);
}

Sample make_prose_multikey(uint64_t seed, const GenOptions& o) {
  Rng rng(hash_combine(seed, hash_string("prose_multikey")));
  const std::vector<std::string> keys = magic_keys(rng, 4), values = magic_numbers(rng, 4);
  std::vector<double> depths = spread_depths(rng, seed, 4, o);
  // The asked needle (index 0) has the cycled depth; the needles are placed in depth order.
  std::vector<size_t> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return depths[a] < depths[b]; });
  ProsePlan p;
  p.task = "prose_multikey";
  p.instruction = magic_instruction("number");
  for (size_t i : order) p.needles.push_back({magic_needle("number", keys[i], values[i]), depths[i]});
  p.question = str_cat("What is the special magic number for ", keys[0], " mentioned in the provided text?");
  p.answer_prefix = str_cat("The special magic number for ", keys[0], " mentioned in the provided text is:");
  p.answers = {values[0]};
  p.avoid = keys;
  p.avoid.insert(p.avoid.end(), values.begin(), values.end());
  p.meta = {{"key", keys[0]}, {"distractor_keys", std::vector<std::string>(keys.begin() + 1, keys.end())},
            {"asked_depth", depths[0]}};
  return build_prose(seed, o, rng, p);
}

Sample make_prose_multivalue(uint64_t seed, const GenOptions& o) {
  Rng rng(hash_combine(seed, hash_string("prose_multivalue")));
  const std::string key = make_key(rng);
  const std::vector<std::string> values = magic_numbers(rng, 4);
  std::vector<double> depths = spread_depths(rng, seed, 4, o);
  std::sort(depths.begin(), depths.end());
  ProsePlan p;
  p.task = "prose_multivalue";
  p.instruction = magic_instruction("number");
  for (size_t i = 0; i < 4; ++i) p.needles.push_back({magic_needle("number", key, values[i]), depths[i]});
  p.question = str_cat("What are all the special magic numbers for ", key,
                       " mentioned in the provided text? List them on one line, separated by commas, in the order they appear.");
  p.answer_prefix = str_cat("The special magic numbers for ", key, " mentioned in the provided text are:");
  p.answers = values;
  p.avoid = {key};
  p.meta = {{"key", key}};
  return build_prose(seed, o, rng, p);
}

Sample make_prose_vartrack(uint64_t seed, const GenOptions& o) {
  Rng rng(hash_combine(seed, hash_string("prose_vartrack")));
  std::vector<std::string> names;
  while (names.size() < 5) {
    std::string n;
    for (int i = 0; i < 5; ++i) n += static_cast<char>('A' + rng.index(26));
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  std::set<std::string> used;
  const std::string value = fresh_number(rng, 10000, 99999, used);
  std::vector<double> depths = spread_depths(rng, seed, 5, o);
  std::sort(depths.begin(), depths.end());
  ProsePlan p;
  p.task = "prose_vartrack";
  p.instruction = "Memorize and track the chain of variable assignments hidden in the following text.";
  p.needles.push_back({str_cat("VAR ", names[0], " = ", value, "."), depths[0]});
  for (size_t i = 1; i < 5; ++i) p.needles.push_back({str_cat("VAR ", names[i], " = VAR ", names[i - 1], "."), depths[i]});
  p.question = str_cat("Find all variables that are assigned the value ", value,
                       " in the text above, in the order of the chain, on one line.");
  p.answer_prefix = str_cat("According to the chain of variable assignments in the text above, 5 variables are "
                            "assigned the value ", value, ", they are:");
  p.answers = names;
  p.avoid = {value, "VAR "};
  p.meta = {{"value", value}};
  return build_prose(seed, o, rng, p);
}

Sample make_prose_qa(uint64_t seed, const GenOptions& o) {
  struct Fact {
    const char *fact, *question, *prefix;
    std::vector<std::string> values;
  };
  static const std::vector<Fact> kFacts = {
      {"{p} keeps the backup tapes in the {v}.", "Where does {p} keep the backup tapes?",
       "{p} keeps the backup tapes in the",
       {"cellar", "attic", "garage", "kitchen", "pantry", "basement", "greenhouse", "workshop", "stable", "barn"}},
      {"{p} was born in the town of {v}.", "In which town was {p} born?", "{p} was born in the town of",
       {"Kessford", "Dunmarrow", "Ashvale", "Thornby", "Mirefield", "Colbridge", "Wexhollow", "Ravensmoor"}},
      {"{p} adopted a cat called {v} last spring.", "What is the name of the cat that {p} adopted?",
       "{p}'s cat is called", pet_names()},
      {"{p} first installed Debian in {v}.", "In what year did {p} first install Debian?",
       "{p} first installed Debian in",
       {"1996", "1998", "1999", "2001", "2003", "2004", "2006", "2008", "2010", "2012", "2014", "2016"}}};
  Rng rng(hash_combine(seed, hash_string("prose_qa")));
  const Fact& f = kFacts[rng.index(kFacts.size())];
  const std::string person = rng.pick(person_names()), value = rng.pick(f.values);
  auto fill = [&](std::string t) {
    for (size_t at; (at = t.find("{p}")) != std::string::npos;) t.replace(at, 3, person);
    for (size_t at; (at = t.find("{v}")) != std::string::npos;) t.replace(at, 3, value);
    return t;
  };
  ProsePlan p;
  p.task = "prose_qa";
  p.instruction = "Read the following text. A question about one fact stated in it follows the text.";
  p.needles = {{fill(f.fact), spread_depths(rng, seed, 1, o)[0]}};
  p.question = "Question: " + fill(f.question) + " Answer in one word.";
  p.answer_prefix = fill(f.prefix);
  p.answers = {value};
  p.avoid = {person};
  p.meta = {{"person", person}, {"fact", fill(f.fact)}};
  return build_prose(seed, o, rng, p);
}

}  // namespace wm::llmtasks
