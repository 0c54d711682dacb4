// multifact: EVOKE-style ChatML sessions. Facts about the user in early user turns, many
// unrelated exchanges (small talk, templated questions with one-word answers, statements about
// other people's things), then one probe per fact; the probe's answer is the target.
#include <algorithm>

#include "runtime/error.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

namespace {

enum class Val { Number, Code, Pet, City, Colour, Person, Fruit, Job, Month, Room };

struct FactType {
  const char* name;
  const char* mine;    // statement about the user, "{v}" for the value, starting lower case
  const char* others;  // statement about someone else, "{w}" for who
  const char* probe;   // question, starting lower case
  Val val;
};

const std::vector<FactType> kFacts = {
    {"favourite_number", "my favourite number is {v}", "my {w}'s favourite number is {v}",
     "what is my favourite number?", Val::Number},
    {"dog", "my dog is called {v}", "my {w}'s dog is called {v}", "what is my dog called?", Val::Pet},
    {"cat", "my cat is called {v}", "my {w}'s cat is called {v}", "what is my cat called?", Val::Pet},
    {"city", "I live in {v}", "my {w} lives in {v}", "which city do I live in?", Val::City},
    {"colour", "my favourite colour is {v}", "my {w}'s favourite colour is {v}",
     "what is my favourite colour?", Val::Colour},
    {"locker", "the code of my locker is {v}", "the code of my {w}'s locker is {v}",
     "what is the code of my locker?", Val::Code},
    {"sister", "my sister is called {v}", "my {w}'s sister is called {v}", "what is my sister called?",
     Val::Person},
    {"fruit", "my favourite fruit is the {v}", "my {w}'s favourite fruit is the {v}",
     "what is my favourite fruit?", Val::Fruit},
    {"job", "I work as a {v}", "my {w} works as a {v}", "what is my job?", Val::Job},
    {"month", "I was born in {v}", "my {w} was born in {v}", "in which month was I born?", Val::Month},
    {"car", "my car is {v}", "my {w}'s car is {v}", "what colour is my car?", Val::Colour},
    {"room", "my hotel room number is {v}", "my {w}'s hotel room number is {v}",
     "what is my hotel room number?", Val::Room}};

const std::vector<std::string> kWho = {"friend", "neighbour", "cousin", "boss", "colleague", "uncle"};
const std::vector<std::string> kFruit = {"apple", "mango", "banana", "cherry", "peach",   "plum",
                                         "pear",  "kiwi",  "lemon",  "melon",  "grape",   "fig",
                                         "apricot", "papaya", "lime", "coconut"};
const std::vector<std::string> kJob = {"baker",   "nurse",     "pilot",   "teacher", "farmer",
                                       "plumber", "dentist",   "painter", "chef",    "librarian",
                                       "gardener", "tailor",   "carpenter", "journalist", "mechanic",
                                       "potter",  "translator", "lawyer"};
const std::vector<std::string> kMonth = {"January", "February", "March",     "April",   "May",      "June",
                                         "July",    "August",   "September", "October", "November", "December"};
const std::vector<std::string> kDay = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};

const std::vector<std::string> kFactLead = {"", "By the way, ", "Oh, and ", "Just so you know, ", "Also, "};
const std::vector<std::string> kProbeLead = {"", "Quick question: ", "Remind me, ", "Tell me, "};
const std::vector<std::string> kFactAck = {"Thanks, noted.", "Got it, I will remember that.",
                                           "Okay, I will keep that in mind.", "Noted.",
                                           "Thank you for telling me."};
const std::vector<std::string> kWhen = {"Today", "Yesterday", "This morning", "Last night", "On Sunday",
                                        "Earlier"};
const std::vector<std::string> kActivity = {
    "went to the market", "cleaned the kitchen",  "read a long book",     "baked some bread",
    "walked by the river", "fixed my bicycle",    "watched an old film",  "planted tomatoes",
    "visited my aunt",    "painted the fence",    "wrote a letter",       "went swimming",
    "cooked soup",        "tidied the garage",    "played chess",         "called an old friend",
    "went for a run",     "repaired a chair",     "sorted my photos",     "took the bus to town"};
const std::vector<std::string> kWeatherAdj = {"lovely", "grey", "rainy", "windy", "cold", "warm", "sunny", "foggy"};
const std::vector<std::string> kMood = {"tired", "happy", "calm", "busy", "cheerful", "sleepy", "relaxed"};
const std::vector<std::string> kPlan = {"go for a walk", "cook pasta",         "tidy my desk",
                                        "call my parents", "read for a while", "water the plants",
                                        "bake a cake",   "write some emails",  "go to bed early"};
const std::vector<std::string> kAck = {"That sounds nice.", "Good to hear.",  "I hope you enjoy it.",
                                       "Thanks for sharing.", "Sounds like a good plan.", "I see.",
                                       "That is lovely.",   "Interesting!",   "Nice.", "Enjoy your day."};
const std::vector<std::pair<std::string, std::string>> kOpposite = {
    {"hot", "cold"},   {"big", "small"},  {"up", "down"},     {"fast", "slow"},  {"light", "dark"},
    {"early", "late"}, {"open", "closed"}, {"full", "empty"}, {"old", "new"},    {"wet", "dry"},
    {"loud", "quiet"}, {"high", "low"},   {"hard", "soft"},   {"rich", "poor"},  {"happy", "sad"},
    {"left", "right"}, {"near", "far"},   {"thick", "thin"},  {"long", "short"}, {"strong", "weak"}};
const std::vector<std::pair<std::string, int>> kLegs = {{"spider", 8}, {"dog", 4},    {"bird", 2},
                                                        {"cat", 4},    {"horse", 4},  {"ant", 6},
                                                        {"beetle", 6}, {"chicken", 2}, {"cow", 4},
                                                        {"duck", 2},   {"bee", 6},    {"goat", 4}};

std::string subst(std::string s, const std::string& key, const std::string& v) {
  size_t p = s.find(key);
  if (p != std::string::npos) s.replace(p, key.size(), v);
  return s;
}

std::string draw_value(Rng& rng, Val val) {
  switch (val) {
    case Val::Number: return std::to_string(rng.uniform_int(10, 999));
    case Val::Code: return std::to_string(rng.uniform_int(1000, 9999));
    case Val::Room: return std::to_string(rng.uniform_int(101, 899));
    case Val::Pet: return rng.pick(pet_names());
    case Val::City: return capitalize(pseudo_word(rng));
    case Val::Colour: return rng.pick(colours());
    case Val::Person: return rng.pick(person_names());
    case Val::Fruit: return rng.pick(kFruit);
    case Val::Job: return rng.pick(kJob);
    case Val::Month: return rng.pick(kMonth);
  }
  throw Error("multifact: unknown value kind");
}

// One exchange: a user message and the assistant's reply. A reply with `answer` set is
// "Answer: <answer>" (split into three segments); otherwise `reply` is its line.
struct Exchange {
  std::string user;
  std::string reply;
  std::string answer;
  std::string answer_kind;  // "answer" (a probe: target) or "reply"
  int64_t tokens = 0;
};

const std::string kUserOpen = "<|im_start|>user\n";
const std::string kAssistantOpen = "<|im_start|>assistant\n";
const std::string kEnd = "<|im_end|>\n";
const std::string kAnswerOpen = kAssistantOpen + "Answer:";

std::string user_msg(const std::string& content) { return kUserOpen + content + kEnd; }
std::string plain_reply(const std::string& line) { return kAssistantOpen + line + "\n" + kEnd; }

struct Costs {
  int64_t answer_open, end;
};

void cost_of(Exchange& e, const TokenCounter& count, const Costs& c) {
  e.tokens = count(user_msg(e.user));
  if (e.answer.empty()) e.tokens += count(plain_reply(e.reply));
  else e.tokens += c.answer_open + count(" " + e.answer + "\n") + c.end;
}

// Small talk or a templated question. `p_other` is the chance of a statement about someone
// else's fact (one of `other_types`).
Exchange filler_exchange(Rng& rng, const std::vector<int>& other_types, std::set<std::string>& used_values) {
  Exchange e;
  int kind = static_cast<int>(rng.uniform_int(0, 13));
  if (kind == 13 && other_types.empty()) kind = 0;
  auto num = [&](int lo, int hi) { return static_cast<int>(rng.uniform_int(lo, hi)); };
  switch (kind) {
    case 0: e.user = rng.pick(kWhen) + " I " + rng.pick(kActivity) + "."; e.reply = rng.pick(kAck); break;
    case 1: e.user = "The weather is " + rng.pick(kWeatherAdj) + " today."; e.reply = rng.pick(kAck); break;
    case 2: e.user = "I am feeling " + rng.pick(kMood) + " today."; e.reply = rng.pick(kAck); break;
    case 3: e.user = "I think I will " + rng.pick(kPlan) + " later."; e.reply = rng.pick(kAck); break;
    case 4: {
      int a = num(1, 50), b = num(1, 50);
      e.user = str_cat("What is ", a, " plus ", b, "?");
      e.answer = std::to_string(a + b);
      break;
    }
    case 5: {
      int a = num(10, 99), b = num(1, a);
      e.user = str_cat("What is ", a, " minus ", b, "?");
      e.answer = std::to_string(a - b);
      break;
    }
    case 6: {
      int a = num(2, 12), b = num(2, 12);
      e.user = str_cat("What is ", a, " times ", b, "?");
      e.answer = std::to_string(a * b);
      break;
    }
    case 7: {
      int a = num(1, 99), b = num(1, 99);
      if (a == b) ++b;
      bool larger = rng.chance(0.5);
      e.user = str_cat("Which is ", larger ? "larger" : "smaller", ", ", a, " or ", b, "?");
      e.answer = std::to_string(larger ? std::max(a, b) : std::min(a, b));
      break;
    }
    case 8: {
      size_t d = rng.index(kDay.size());
      e.user = "What day comes after " + kDay[d] + "?";
      e.answer = kDay[(d + 1) % kDay.size()];
      break;
    }
    case 9: {
      size_t m = rng.index(kMonth.size());
      e.user = "What month comes after " + kMonth[m] + "?";
      e.answer = kMonth[(m + 1) % kMonth.size()];
      break;
    }
    case 10: {
      const auto& p = kOpposite[rng.index(kOpposite.size())];
      bool flip = rng.chance(0.5);
      e.user = "What is the opposite of " + (flip ? p.second : p.first) + "?";
      e.answer = flip ? p.first : p.second;
      break;
    }
    case 11: {
      const auto& p = kLegs[rng.index(kLegs.size())];
      e.user = "How many legs does a " + p.first + " have?";
      e.answer = std::to_string(p.second);
      break;
    }
    case 12: {
      int a = num(2, 60);
      e.user = str_cat("What is double ", a, "?");
      e.answer = std::to_string(2 * a);
      break;
    }
    default: {  // someone else's fact: a distractor for a planted fact of the same type
      const FactType& t = kFacts[rng.pick(other_types)];
      std::string v;
      do v = draw_value(rng, t.val);
      while (used_values.count(v));
      std::string statement = subst(subst(t.others, "{w}", rng.pick(kWho)), "{v}", v);
      e.user = capitalize(rng.pick(kFactLead) + statement + ".");
      e.reply = rng.pick(kFactAck);
      break;
    }
  }
  if (!e.answer.empty()) e.answer_kind = "reply";
  return e;
}

bool mentions_any(const Exchange& e, const std::set<std::string>& values) {
  for (const std::string& v : values)
    if (e.user.find(v) != std::string::npos || e.reply.find(v) != std::string::npos || e.answer == v)
      return true;
  return false;
}

// Unrelated exchanges until the length is closest to target; none mentions a fact's value.
// *total (the tokens so far) grows by theirs.
std::vector<Exchange> filler_exchanges(Rng& rng, const std::vector<int>& other_types, std::set<std::string>& used_values,
                                       const std::set<std::string>& fact_values, const TokenCounter& count,
                                       const Costs& costs, int64_t target, int64_t* total) {
  std::vector<Exchange> filler;
  while (true) {
    Exchange e = filler_exchange(rng, other_types, used_values);
    if (mentions_any(e, fact_values)) continue;
    cost_of(e, count, costs);
    if (!closer_with(*total, e.tokens, target)) break;
    *total += e.tokens;
    filler.push_back(std::move(e));
  }
  return filler;
}

// Appends exchange e to s as two turns from `turn` on (the user's message, then the reply: a
// plain one, or the answer's segment between its opening and its end); returns the next turn.
int emit_exchange(Sample& s, int turn, const Exchange& e) {
  push_segment(s, str_cat("turn:", turn), "user", user_msg(e.user));
  ++turn;
  if (e.answer.empty()) {
    push_segment(s, str_cat("turn:", turn), "assistant", plain_reply(e.reply));
  } else {
    push_segment(s, str_cat("turn:", turn), "assistant", kAnswerOpen);
    push_segment(s, str_cat("turn:", turn, ":answer"), e.answer_kind, " " + e.answer + "\n", e.answer_kind == "answer");
    push_segment(s, str_cat("turn:", turn, ":end"), "assistant", kEnd);
  }
  return turn + 1;
}

}  // namespace

Sample make_multifact(uint64_t seed, const GenOptions& o) {
  check_common(o, "multifact");
  const TokenCounter count = counter_of(o);
  const int64_t target = o.target_tokens;
  Rng rng(hash_combine(seed, hash_string("multifact")));
  int nfacts = o.multifact_facts;
  if (nfacts == 0) nfacts = static_cast<int>(rng.uniform_int(1, std::clamp<int64_t>(target / 128, 1, 5)));
  if (nfacts < 1 || nfacts > 8) throw Error(str_cat("multifact: facts must be in [1, 8], got ", nfacts));

  // Fact types and values: distinct types, values distinct across the session.
  std::vector<int> types(kFacts.size());
  for (size_t i = 0; i < types.size(); ++i) types[i] = static_cast<int>(i);
  rng.shuffle(types);
  types.resize(nfacts);
  std::vector<std::string> values;
  std::set<std::string> used_values;
  for (int t : types) {
    std::string v;
    do v = draw_value(rng, kFacts[t].val);
    while (!used_values.insert(v).second);
    values.push_back(v);
  }
  const std::set<std::string> fact_values = used_values;

  const Costs costs{count(kAnswerOpen), count(kEnd)};
  const std::string system = "<|im_start|>system\nYou are a helpful assistant. Remember what the user "
                             "tells you about themselves.<|im_end|>\n";
  int64_t fixed = count(system);
  std::vector<Exchange> facts(nfacts), probes(nfacts);
  for (int i = 0; i < nfacts; ++i) {
    const FactType& t = kFacts[types[i]];
    std::string statement = subst(t.mine, "{v}", values[i]);
    std::string lead = rng.pick(kFactLead);
    if (rng.chance(0.4)) {
      Exchange chat = filler_exchange(rng, {}, used_values);
      while (!chat.answer.empty() || mentions_any(chat, fact_values)) chat = filler_exchange(rng, {}, used_values);
      lead = chat.user + " " + (lead.empty() ? "Also, " : lead);
    }
    facts[i].user = capitalize(lead + statement + ".");
    facts[i].reply = rng.pick(kFactAck);
    probes[i].user = capitalize(rng.pick(kProbeLead) + t.probe);
    probes[i].answer = values[i];
    probes[i].answer_kind = "answer";
    cost_of(facts[i], count, costs);
    cost_of(probes[i], count, costs);
    fixed += facts[i].tokens + probes[i].tokens;
  }

  // Unrelated exchanges until the length is reached; none mentions a fact's value.
  std::vector<int> other_types = o.multifact_distractors ? types : std::vector<int>{};
  int64_t total = fixed;
  const std::vector<Exchange> filler =
      filler_exchanges(rng, other_types, used_values, fact_values, count, costs, target, &total);

  // Facts go among the first 40% of the exchanges, in random order; probes come last, shuffled.
  const int nf = static_cast<int>(filler.size());
  std::vector<std::pair<int, int>> fact_at;  // (filler index before which, fact)
  for (int i = 0; i < nfacts; ++i) fact_at.push_back({static_cast<int>(rng.uniform_int(0, nf * 2 / 5)), i});
  std::stable_sort(fact_at.begin(), fact_at.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int> probe_order(nfacts);
  for (int i = 0; i < nfacts; ++i) probe_order[i] = i;
  rng.shuffle(probe_order);

  Sample s;
  s.task = "multifact";
  s.seed = seed;
  push_segment(s, "system", "system", system);
  int turn = 0;
  nlohmann::json jfacts = nlohmann::json::array();
  std::vector<int> fact_turn(nfacts), probe_turn(nfacts);
  size_t next_fact = 0;
  for (int k = 0; k <= nf; ++k) {
    while (next_fact < fact_at.size() && fact_at[next_fact].first == k) {
      int i = fact_at[next_fact++].second;
      fact_turn[i] = turn;
      turn = emit_exchange(s, turn, facts[i]);
    }
    if (k < nf) turn = emit_exchange(s, turn, filler[k]);
  }
  for (int i : probe_order) {
    probe_turn[i] = turn;
    turn = emit_exchange(s, turn, probes[i]);
  }
  for (int i = 0; i < nfacts; ++i)
    jfacts.push_back({{"type", kFacts[types[i]].name}, {"value", values[i]}, {"fact_turn", fact_turn[i]},
                      {"probe_turn", probe_turn[i]}});
  s.meta = {{"facts", jfacts}, {"exchanges", nf}, {"tokens", total}, {"target_tokens", target}};
  return s;
}

}  // namespace wm::llmtasks
