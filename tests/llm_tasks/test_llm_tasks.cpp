// Tests of the text task generators (tools/llm_tasks): determinism, the seed split, the target
// format, lengths, and that every target is recoverable from the text before it by an oracle
// written here, independently of the generators.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tools/llm_tasks/plan_world.h"
#include "tools/llm_tasks/sample.h"

namespace wm::llmtasks {
namespace {

GenOptions opts(int64_t tokens) {
  GenOptions o;
  o.target_tokens = tokens;
  o.count = bytes_counter(4.0);
  return o;
}

// The answer inside a target text " X\n".
std::string answer_of(const Segment& s) { return s.text.substr(1, s.text.size() - 2); }

int64_t max_segment_tokens(const Sample& s, const TokenCounter& count) {
  int64_t m = 0;
  for (const Segment& g : s.segments) m = std::max(m, count(g.text));
  return m;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

TEST(LlmTasks, TaskNamesAndUnknownTask) {
  EXPECT_EQ(task_names(), (std::vector<std::string>{"mqar", "niah", "multifact", "plan"}));
  EXPECT_THROW(make_sample("sudoku", 1, opts(256)), wm::Error);
  GenOptions tiny = opts(10);
  for (const std::string& t : task_names()) EXPECT_THROW(make_sample(t, 1, tiny), wm::Error) << t;
}

TEST(LlmTasks, SameSeedSameSampleDifferentSeedDifferent) {
  for (const std::string& t : task_names()) {
    for (int64_t len : {256, 1024}) {
      std::set<std::string> texts;
      for (uint64_t seed : std::vector<uint64_t>{1, 2, 3, heldout_seed(1)}) {
        Sample a = make_sample(t, seed, opts(len)), b = make_sample(t, seed, opts(len));
        EXPECT_EQ(a.to_json().dump(), b.to_json().dump()) << t << " " << seed;
        EXPECT_EQ(a.task, t);
        EXPECT_EQ(a.seed, seed);
        texts.insert(a.text());
      }
      EXPECT_EQ(texts.size(), 4u) << t << " at " << len;
    }
  }
}

TEST(LlmTasks, HeldoutAndTrainingSeedsAreDisjoint) {
  std::set<uint64_t> train, held;
  for (uint64_t i : std::vector<uint64_t>{0, 1, 2, 1000, (uint64_t(1) << 40) + 7, kHeldoutBit - 1}) {
    train.insert(training_seed(i));
    held.insert(heldout_seed(i));
    EXPECT_FALSE(is_heldout(training_seed(i))) << i;
    EXPECT_TRUE(is_heldout(heldout_seed(i))) << i;
  }
  for (uint64_t s : train) EXPECT_EQ(held.count(s), 0u);
  std::vector<uint64_t> h = heldout_seeds(10, 100);
  ASSERT_EQ(h.size(), 100u);
  EXPECT_EQ(std::set<uint64_t>(h.begin(), h.end()).size(), 100u);
  for (uint64_t s : h) EXPECT_TRUE(is_heldout(s));
  EXPECT_EQ(h[0], heldout_seed(10));
  EXPECT_THROW(training_seed(kHeldoutBit), wm::Error);
  EXPECT_THROW(heldout_seed(kHeldoutBit), wm::Error);
  EXPECT_FALSE(is_heldout(12345));
  EXPECT_TRUE(is_heldout(12345 | kHeldoutBit));
}

TEST(LlmTasks, TargetFormatAndUniqueIds) {
  for (const std::string& t : task_names()) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      Sample s = make_sample(t, seed, opts(seed % 2 ? 512 : 1536));
      std::set<std::string> ids;
      for (const Segment& g : s.segments) {
        EXPECT_TRUE(ids.insert(g.id).second) << t << " duplicate id " << g.id;
        EXPECT_FALSE(g.text.empty()) << t << " " << g.id;
      }
      std::vector<size_t> targets = s.targets();
      ASSERT_FALSE(targets.empty()) << t << " " << seed;
      for (size_t i : targets) {
        const Segment& g = s.segments[i];
        ASSERT_GE(g.text.size(), 3u);
        EXPECT_EQ(g.text.front(), ' ') << t;
        EXPECT_EQ(g.text.back(), '\n') << t;
        EXPECT_EQ(std::count(g.text.begin(), g.text.end(), '\n'), 1) << t;
        EXPECT_NE(g.text[1], ' ') << t;
        EXPECT_EQ(g.kind, "answer");
        EXPECT_EQ(g.id.substr(g.id.size() - 7), ":answer");
        ASSERT_GT(i, 0u);
        EXPECT_FALSE(s.segments[i - 1].target);
        // The cue before the target ends with ':', but for mqar, whose cue is the key itself.
        if (t == "mqar")
          EXPECT_TRUE(std::all_of(s.segments[i - 1].text.begin(), s.segments[i - 1].text.end(),
                                  [](char c) { return c >= 'a' && c <= 'z'; }))
              << s.segments[i - 1].text;
        else
          EXPECT_EQ(s.segments[i - 1].text.back(), ':') << t << " " << s.segments[i - 1].text;
        EXPECT_EQ(s.text_before(i).size(), s.offset_of(i));
      }
      EXPECT_EQ(s.text().size(), s.offset_of(s.segments.size()));
    }
  }
}

int64_t segment_sum(const Sample& s, const TokenCounter& count) {
  int64_t n = 0;
  for (const Segment& g : s.segments) n += count(g.text);
  return n;
}

TEST(LlmTasks, LengthsNearTarget) {
  // The generators control the sum of per-segment counts: within 3% (5% at 256 tokens) and never
  // over by more than one segment. The whole text counted at once differs from that sum by the
  // counter's rounding per segment (bytes/4 rounds each short segment): within 8% here, 15% for
  // mqar, whose segments are 4-9 bytes ("zuvo 48\n" counts 2, "zuvo" and " 48\n" 1 each).
  TokenCounter count = bytes_counter(4.0);
  for (const std::string& t : task_names()) {
    for (int64_t len : {256, 1024, 4096}) {
      double worst_sum = 0, worst_text = 0;
      for (uint64_t seed = 0; seed < 12; ++seed) {
        Sample s = make_sample(t, seed, opts(len));
        const int64_t sum = segment_sum(s, count), whole = count(s.text());
        const double rel_sum = std::abs(static_cast<double>(sum - len)) / len;
        const double rel_text = std::abs(static_cast<double>(whole - len)) / len;
        worst_sum = std::max(worst_sum, rel_sum);
        worst_text = std::max(worst_text, rel_text);
        EXPECT_LE(rel_sum, len == 256 ? 0.05 : 0.03) << t << " seed " << seed << ": " << sum << " for " << len;
        EXPECT_LE(rel_text, t == "mqar" ? 0.15 : 0.08) << t << " seed " << seed << ": " << whole << " for " << len;
        EXPECT_LE(sum, len + max_segment_tokens(s, count)) << t << " seed " << seed;
        EXPECT_EQ(s.meta["tokens"].get<int64_t>(), sum) << t << " seed " << seed;
      }
      std::cout << "[length] " << t << " " << len << ": worst deviation, segment sum " << worst_sum * 100
                << "%, whole text " << worst_text * 100 << "%\n";
    }
  }
}

TEST(LlmTasks, LengthsFollowTheGivenCounter) {
  // A word counter instead of bytes: the generators must use it, not bytes.
  TokenCounter words = [](const std::string& s) {
    int64_t n = 0;
    bool in = false;
    for (char c : s) {
      bool w = !(c == ' ' || c == '\n');
      if (w && !in) ++n;
      in = w;
    }
    return n;
  };
  for (const std::string& t : task_names()) {
    for (uint64_t seed = 0; seed < 5; ++seed) {
      GenOptions o;
      o.target_tokens = 600;
      o.count = words;
      Sample s = make_sample(t, seed, o);
      int64_t n = words(s.text());
      EXPECT_NEAR(static_cast<double>(n), 600.0, 0.06 * 600) << t << " seed " << seed;
    }
  }
}

// ---- mqar ----------------------------------------------------------------------------------

TEST(LlmTasks, MqarAnswersFollowFromThePairs) {
  const std::regex pair_re("^([a-z]+) ([0-9]+)$");
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Sample s = make_sample("mqar", seed, opts(seed % 3 == 0 ? 256 : 2048));
    for (size_t i : s.targets()) {
      std::map<std::string, std::string> pairs;
      int lines = 0;
      for (const std::string& line : lines_of(s.text_before(i))) {
        if (line == "Recall:") break;  // the queries follow
        std::smatch m;
        if (std::regex_match(line, m, pair_re)) {
          EXPECT_TRUE(pairs.emplace(m[1], m[2]).second) << "key twice: " << m[1];
          ++lines;
        }
      }
      const std::string& cue = s.segments[i - 1].text;
      ASSERT_EQ(s.text_before(i).find("\nRecall:\n") != std::string::npos, true);
      const std::string key = cue;  // the query is the key alone
      ASSERT_TRUE(pairs.count(key)) << key;
      EXPECT_EQ(pairs[key], answer_of(s.segments[i]));
      EXPECT_EQ(lines, s.meta["pairs"].get<int>());
    }
    EXPECT_EQ(static_cast<int>(s.targets().size()), s.meta["queries"].get<int>());
    EXPECT_GE(s.meta["pairs"].get<int>(), 2 * std::min(s.meta["queries"].get<int>(), 32));
  }
}

TEST(LlmTasks, MqarOptions) {
  GenOptions o = opts(1024);
  o.mqar_pairs = 20;
  o.mqar_queries = 7;
  Sample s = make_mqar(5, o);
  int kv = 0, filler = 0;
  std::set<std::string> queried;
  for (const Segment& g : s.segments) {
    kv += g.kind == "pair";
    filler += g.kind == "filler";
    if (g.kind == "query") queried.insert(g.text);
  }
  EXPECT_EQ(kv, 20);
  EXPECT_EQ(queried.size(), 7u);
  EXPECT_EQ(s.targets().size(), 7u);
  EXPECT_GT(filler, 0);  // 20 pairs leave room: filler pads to the length
  EXPECT_NEAR(static_cast<double>(o.count(s.text())), 1024.0, 0.04 * 1024);
  // No filler contains a pair's value.
  for (const Segment& g : s.segments) {
    if (g.kind != "filler") continue;
    for (size_t i : s.targets()) EXPECT_EQ(g.text.find(answer_of(s.segments[i])), std::string::npos);
  }
  o.mqar_queries = 21;
  EXPECT_THROW(make_mqar(5, o), wm::Error);
}

// ---- niah ----------------------------------------------------------------------------------

TEST(LlmTasks, NiahNeedlePrecedesItsQuestionAndHoldsTheAnswer) {
  const std::regex q_re("Question: What is the secret code of the ([a-z]+ [a-z]+)\\?\nAnswer:");
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Sample s = make_sample("niah", seed, opts(seed % 2 ? 512 : 3000));
    ASSERT_GE(s.targets().size(), 1u);
    ASSERT_LE(s.targets().size(), 5u);
    for (size_t i : s.targets()) {
      std::smatch m;
      const std::string cue = s.segments[i - 1].text;
      ASSERT_TRUE(std::regex_match(cue, m, q_re)) << cue;
      const std::string subject = m[1];
      const std::string before = s.text_before(i - 1);
      const std::string phrase = "secret code of the " + subject + " is ";
      size_t at = before.find(phrase);
      ASSERT_NE(at, std::string::npos) << subject;
      EXPECT_EQ(before.find(phrase, at + 1), std::string::npos) << "needle twice";
      size_t v = at + phrase.size();
      std::string value = before.substr(v, before.find('.', v) - v);
      EXPECT_EQ(value, answer_of(s.segments[i]));
    }
    // Filler never holds a needle's value or the needle phrase.
    for (const Segment& g : s.segments) {
      if (g.kind != "filler") continue;
      EXPECT_EQ(g.text.find("secret code"), std::string::npos) << g.text;
      for (size_t i : s.targets()) EXPECT_EQ(g.text.find(answer_of(s.segments[i])), std::string::npos) << g.text;
    }
  }
}

TEST(LlmTasks, NiahDepths) {
  GenOptions o = opts(2048);
  o.niah_depths = {0.0, 0.5, 1.0};
  Sample s = make_niah(9, o);
  ASSERT_EQ(s.targets().size(), 3u);
  size_t first_filler = s.segments.size(), last_filler = 0;
  size_t filler_bytes = 0;
  for (size_t k = 0; k < s.segments.size(); ++k)
    if (s.segments[k].kind == "filler") {
      first_filler = std::min(first_filler, k);
      last_filler = k;
      filler_bytes += s.segments[k].text.size();
    }
  size_t n0 = s.find("needle:0"), n1 = s.find("needle:1"), n2 = s.find("needle:2");
  ASSERT_LT(n2, s.segments.size());
  EXPECT_LT(n0, first_filler);
  EXPECT_GT(n2, last_filler);
  size_t filler_before_mid = 0;
  for (size_t k = 0; k < n1; ++k)
    if (s.segments[k].kind == "filler") filler_before_mid += s.segments[k].text.size();
  double frac = static_cast<double>(filler_before_mid) / filler_bytes;
  EXPECT_NEAR(frac, 0.5, 0.05);
  o.niah_depths = {1.5};
  EXPECT_THROW(make_niah(9, o), wm::Error);
  o.niah_depths = {};
  o.niah_needles = 6;
  EXPECT_THROW(make_niah(9, o), wm::Error);
}

// ---- multifact -----------------------------------------------------------------------------

TEST(LlmTasks, MultifactValueStatedInAnEarlierUserTurn) {
  // Probe question -> the statement that answers it (the oracle's own table).
  const std::vector<std::pair<std::string, std::string>> table = {
      {"what is my favourite number?", "my favourite number is "},
      {"what is my dog called?", "my dog is called "},
      {"what is my cat called?", "my cat is called "},
      {"which city do i live in?", "I live in "},
      {"what is my favourite colour?", "my favourite colour is "},
      {"what is the code of my locker?", "the code of my locker is "},
      {"what is my sister called?", "my sister is called "},
      {"what is my favourite fruit?", "my favourite fruit is the "},
      {"what is my job?", "I work as a "},
      {"in which month was i born?", "I was born in "},
      {"what colour is my car?", "my car is "},
      {"what is my hotel room number?", "my hotel room number is "}};
  auto lower = [](std::string x) {
    for (char& c : x) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return x;
  };
  int probes = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Sample s = make_sample("multifact", seed, opts(seed % 2 ? 400 : 2500));
    const std::string text = s.text();
    EXPECT_EQ(s.segments[0].id, "system");
    // ChatML is well formed: as many starts as ends, and every segment's id fits its kind.
    size_t starts = 0, ends = 0;
    for (size_t p = 0; (p = text.find("<|im_start|>", p)) != std::string::npos; ++p) ++starts;
    for (size_t p = 0; (p = text.find("<|im_end|>", p)) != std::string::npos; ++p) ++ends;
    EXPECT_EQ(starts, ends);
    for (size_t i : s.targets()) {
      ++probes;
      // The user message just before this reply.
      size_t u = i - 1;
      while (s.segments[u].kind != "user") --u;
      std::string question = s.segments[u].text;
      question = question.substr(question.find('\n') + 1);
      question = lower(question.substr(0, question.find("<|im_end|>")));
      std::string statement;
      for (const auto& [q, st] : table)
        if (question.size() >= q.size() && question.compare(question.size() - q.size(), q.size(), q) == 0)
          statement = st;
      ASSERT_FALSE(statement.empty()) << question;
      // Exactly one earlier user turn states the user's own fact; its value is the answer. (Other
      // people's facts read "my friend's dog is called ...", which the statement does not match.)
      const std::string st = lower(statement);
      std::vector<std::string> found;
      for (size_t k = 0; k < u; ++k) {
        const Segment& g = s.segments[k];
        if (g.kind != "user") continue;
        const std::string low = lower(g.text);
        for (size_t p = low.find(st); p != std::string::npos; p = low.find(st, p + 1)) {
          size_t v = p + st.size();
          found.push_back(g.text.substr(v, g.text.find('.', v) - v));
        }
      }
      ASSERT_EQ(found.size(), 1u) << question << " in seed " << seed;
      EXPECT_EQ(found[0], answer_of(s.segments[i]));
      // No assistant turn says the value, and no other user turn does.
      int user_mentions = 0;
      for (size_t k = 0; k < s.segments.size(); ++k) {
        const Segment& g = s.segments[k];
        if (g.kind == "assistant" || g.kind == "reply") {
          EXPECT_EQ(g.text.find(found[0]), std::string::npos) << g.text << " gives away " << found[0];
        }
        if (g.kind == "user" && g.text.find(found[0]) != std::string::npos) ++user_mentions;
      }
      EXPECT_EQ(user_mentions, 1) << found[0];
    }
  }
  EXPECT_GT(probes, 60);
}

TEST(LlmTasks, MultifactFactsAreEarlyAndProbesLast) {
  GenOptions o = opts(3000);
  o.multifact_facts = 4;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Sample s = make_multifact(seed, o);
    ASSERT_EQ(s.targets().size(), 4u);
    int turns = 0;
    for (const Segment& g : s.segments) turns += g.kind == "user";
    for (const auto& f : s.meta["facts"]) {
      EXPECT_LT(f["fact_turn"].get<int>(), turns);  // within the first 40% of the exchanges (+ facts)
      EXPECT_LT(f["fact_turn"].get<int>(), 2 * (turns * 2 / 5 + 4));
      EXPECT_GT(f["probe_turn"].get<int>(), 2 * (turns - 5));
    }
  }
}

// ---- plan ----------------------------------------------------------------------------------

// The house as the text states it: memory lines, later lines replacing earlier ones.
struct TextState {
  std::map<std::string, nlohmann::json> things;
  void read(const std::string& line) {
    nlohmann::json j = nlohmann::json::parse(line);  // every memory line is valid JSON
    things[j.at("object").get<std::string>()] = j;
  }
  std::string pos(const std::string& n) const { return things.at(n).at("position").get<std::string>(); }
  std::string state(const std::string& n) const {
    const auto& j = things.at(n);
    return j.contains("state") ? j.at("state").get<std::string>() : "";
  }
  // "in the kitchen" for the room a thing is in, following "in/on the <holder>".
  std::string room_of(const std::string& n) const {
    std::string p = pos(n);
    if (p == "in hand") return pos("agent");
    std::string holder = p.substr(p.find("the ") + 4);
    if (things.count(holder)) return pos(holder);
    return p.rfind("on ", 0) == 0 ? "" : "in the " + holder;
  }
  // Checks the action's preconditions against the text alone.
  bool allows(const std::string& action, std::string* why) const {
    std::vector<std::string> w;
    std::stringstream ss(action);
    for (std::string x; ss >> x;) w.push_back(x);
    const std::string agent = pos("agent");
    auto no = [&](const std::string& m) {
      *why = m;
      return false;
    };
    if (w[0] == "goto") {
      if (agent == "in the " + w[1]) return no("already there");
      if (w[1] != "hall" && state(w[1] + "-door") == "locked") return no("door locked");
      if (w[1] != "hall" && !things.count(w[1] + "-door")) return no("no such room");
      return true;
    }
    if (!things.count(w[1])) return no(w[1] + " not in memory");
    if (w[0] == "open") return state(w[1]) == "closed" && pos(w[1]) == agent ? true : no("cannot open");
    if (w[0] == "unlock") {
      if (state(w[1]) != "locked") return no("not locked");
      if (pos(things.at(w[1]).at("key").get<std::string>()) != "in hand") return no("key not in hand");
      bool door = w[1].size() > 5 && w[1].compare(w[1].size() - 5, 5, "-door") == 0;
      return (door ? agent == "in the hall" : pos(w[1]) == agent) ? true : no("not here");
    }
    if (w[0] == "take") {
      if (pos(w[1]) == "in hand") return no("held");
      if (room_of(w[1]) != agent) return no("elsewhere: " + room_of(w[1]));
      std::string holder = pos(w[1]).substr(pos(w[1]).find("the ") + 4);
      if (things.count(holder) && !state(holder).empty() && state(holder) != "open") return no("closed");
      return true;
    }
    if (w[0] == "put") {
      if (pos(w[1]) != "in hand") return no("not held");
      if (!things.count(w[2]) || pos(w[2]) != agent) return no("place not here");
      if (!state(w[2]).empty() && state(w[2]) != "open") return no("place closed");
      return true;
    }
    return no("unknown verb");
  }
};

TEST(LlmTasks, PlanReplayOracleAndTextConsistency) {
  const std::regex step_re("^Step ([0-9]+): (.+)\n$");
  int samples = 0, targets = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const int64_t len = seed % 4 == 0 ? 256 : seed % 4 == 1 ? 700 : seed % 4 == 2 ? 1500 : 3000;
    Sample s = make_sample("plan", seed, opts(len));
    ++samples;
    World w = World::generate(s.meta["world_seed"].get<uint64_t>(), WorldSpec::from_json(s.meta["spec"]));
    Goal goal;
    World again = World::generate(s.meta["world_seed"].get<uint64_t>(), WorldSpec::from_json(s.meta["spec"]), &goal);
    EXPECT_EQ(goal.text(), s.meta["goal"]["text"].get<std::string>());
    EXPECT_NE(s.text().find("Goal: " + goal.text() + ".\n"), std::string::npos);

    // Replay the actions the text says were done.
    TextState ts;
    std::vector<Segment> mem;
    size_t k = 0;
    for (; k < s.segments.size() && !s.segments[k].target; ++k) {
      const Segment& g = s.segments[k];
      if (g.kind == "state") {
        mem.push_back(g);
        ts.read(g.text);
      }
      if (g.kind == "action") {
        std::smatch m;
        ASSERT_TRUE(std::regex_match(g.text, m, step_re)) << g.text;
        std::string err;
        ASSERT_TRUE(w.execute(m[2], &err)) << "seed " << seed << ": " << m[2] << ": " << err;
      }
    }
    // The memory in the text is the replayed state's memory, id for id.
    std::vector<Segment> expect = w.memory_lines();
    ASSERT_EQ(mem.size(), expect.size()) << "seed " << seed;
    for (size_t i = 0; i < mem.size(); ++i) {
      EXPECT_EQ(mem[i].id, expect[i].id);
      EXPECT_EQ(mem[i].text, expect[i].text);
    }
    // Each target: the oracle's action, allowed by the text's state, executable; the update lines
    // that follow are exactly the lines it changed.
    for (; k < s.segments.size(); ++k) {
      const Segment& g = s.segments[k];
      if (g.kind == "state") {
        ts.read(g.text);
        continue;
      }
      if (!g.target) continue;
      ++targets;
      const std::string action = answer_of(g);
      EXPECT_EQ(w.oracle_next_action(goal), action) << "seed " << seed;
      std::string why;
      EXPECT_TRUE(ts.allows(action, &why)) << "seed " << seed << ": " << action << ": " << why;
      World before = w;
      std::string err;
      ASSERT_TRUE(w.execute(action, &err)) << action << ": " << err;
      size_t u = k + 1;
      std::vector<std::string> updates;
      for (; u < s.segments.size() && s.segments[u].kind == "state"; ++u) updates.push_back(s.segments[u].text);
      if (u < s.segments.size()) {  // not the last target: the changed lines follow
        std::vector<std::string> changed;
        for (const std::string& n : w.names())
          if (before.memory_line(n) != w.memory_line(n)) changed.push_back(w.memory_line(n) + "\n");
        EXPECT_EQ(updates, changed) << "seed " << seed << " after " << action;
        EXPECT_FALSE(changed.empty());
      }
    }
    // Following the oracle from here solves the goal within a bound, each step executable.
    int steps = 0;
    while (!w.goal_done(goal) && steps < 120) {
      std::string a = w.oracle_next_action(goal), err;
      ASSERT_TRUE(w.execute(a, &err)) << "seed " << seed << ": " << a << ": " << err;
      ++steps;
    }
    EXPECT_TRUE(w.goal_done(goal)) << "seed " << seed;
    EXPECT_EQ(w.oracle_next_action(goal), "");
  }
  EXPECT_EQ(samples, 200);
  EXPECT_GT(targets, 300);
}

TEST(LlmTasks, PlanNeedsChainsOfMemoryLines) {
  // A target whose argument the goal does not name and whose decision reads a key's line and at
  // least four lines in all: door -> key -> where the key is -> that place's room.
  int with_chain = 0, total = 0;
  size_t longest = 0;
  for (uint64_t seed = 0; seed < 150; ++seed) {
    Sample s = make_sample("plan", seed, opts(1200));
    const std::string goal = s.meta["goal"]["text"].get<std::string>();
    for (const auto& t : s.meta["targets"]) {
      ++total;
      std::string action = t["action"].get<std::string>();
      std::string arg = action.substr(action.find(' ') + 1);
      auto support = t["support"].get<std::vector<std::string>>();
      longest = std::max(longest, support.size());
      bool key = std::any_of(support.begin(), support.end(), [](const std::string& n) {
        return n.size() > 4 && n.compare(n.size() - 4, 4, "-key") == 0;
      });
      if (key && support.size() >= 4 && goal.find(arg) == std::string::npos) ++with_chain;
    }
  }
  EXPECT_GT(with_chain, total / 5) << with_chain << " of " << total;
  EXPECT_GE(longest, 6u);
}

TEST(LlmTasks, PlanMemoryScalesWithLength) {
  for (int64_t len : {256, 1024, 4096}) {
    Sample s = make_sample("plan", 3, opts(len));
    int64_t mem_tokens = 0;
    TokenCounter count = bytes_counter(4.0);
    for (const Segment& g : s.segments)
      if (g.kind == "state" && g.id.rfind("mem:", 0) == 0) mem_tokens += count(g.text);
    if (len == 4096) {
      EXPECT_GE(mem_tokens, 2000);
    }
    if (len == 1024) {
      EXPECT_GE(mem_tokens, 400);
    }
    EXPECT_LE(mem_tokens, len);
  }
}

TEST(LlmTasks, PlanStaticPrefixIsShared) {
  // The rules and the example are the same text in every sample of a length class, so that their
  // KV can be computed once.
  Sample a = make_sample("plan", 1, opts(2048)), b = make_sample("plan", 2, opts(2048));
  ASSERT_EQ(a.segments[0].id, "system");
  ASSERT_EQ(a.segments[1].id, "example");
  EXPECT_EQ(a.segments[0].text, b.segments[0].text);
  EXPECT_EQ(a.segments[1].text, b.segments[1].text);
  EXPECT_EQ(a.segments[2].text, "Memory:\n");
  EXPECT_EQ(a.segments[3].id, "mem:agent");
  Sample c = make_sample("plan", 1, opts(300));
  EXPECT_EQ(c.find("example"), c.segments.size());  // too short for the example
  EXPECT_LT(c.segments[0].text.size(), a.segments[0].text.size());
}

TEST(LlmTasks, WorldOracleSolvesDesignedGoals) {
  int with_unlock = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    WorldSpec spec;
    spec.rooms = 1 + static_cast<int>(seed % 8);
    spec.containers = 1 + static_cast<int>(seed % 11);
    spec.furniture = 1 + static_cast<int>(seed % 5);
    spec.locks = std::min<int>(static_cast<int>(seed % 6), std::min(14, spec.rooms + spec.containers));
    spec.objects = 1 + static_cast<int>(seed % 4);
    spec.distractors = static_cast<int>(seed % 30);
    Goal goal;
    World w = World::generate(seed, spec, &goal);
    EXPECT_FALSE(w.goal_done(goal));
    std::vector<std::string> plan = w.solve(goal, 150);
    for (const std::string& a : plan) {
      std::string err;
      ASSERT_TRUE(w.execute(a, &err)) << a << ": " << err;
    }
    EXPECT_TRUE(w.goal_done(goal));
    with_unlock += std::any_of(plan.begin(), plan.end(), [](const std::string& a) { return a.rfind("unlock", 0) == 0; });
  }
  EXPECT_GT(with_unlock, 80);
}

TEST(LlmTasks, WorldRejectsIllegalActionsAndKeepsState) {
  WorldSpec spec;
  spec.rooms = 3;
  spec.containers = 3;
  spec.locks = 2;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    World w = World::generate(seed, spec);
    std::vector<Segment> before = w.memory_lines();
    std::string err;
    for (const char* bad : {"fly kitchen", "goto", "goto  hall", "take", "put apple", "open hall",
                                   "take agent", "goto garden", "unlock hall"}) {
      EXPECT_FALSE(w.execute(bad, &err)) << bad;
      EXPECT_FALSE(err.empty());
    }
    // Every locked door refuses entry, every held-nothing put fails.
    for (const std::string& r : w.rooms())
      if (r != "hall" && w.thing(r + "-door").locked) {
        EXPECT_FALSE(w.execute("goto " + r, &err));
      }
    for (const std::string& n : w.names())
      if (n != "agent" && w.thing(n).kind == World::Kind::Object) {
        EXPECT_FALSE(w.execute("put " + n + " " + n, &err));
        if (w.room_of(n) != w.agent_room()) {
          EXPECT_FALSE(w.execute("take " + n, &err)) << n;
        }
      }
    std::vector<Segment> after = w.memory_lines();
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].text, after[i].text);
  }
}

TEST(LlmTasks, WorldDistractorsArePrefixes) {
  WorldSpec spec;
  spec.rooms = 4;
  spec.containers = 5;
  spec.locks = 2;
  spec.distractors = 40;
  World big = World::generate(77, spec);
  spec.distractors = 39;
  World small = World::generate(77, spec);
  std::vector<std::string> names = big.names();
  names.erase(std::find(names.begin(), names.end(), big.distractor_names().back()));
  EXPECT_EQ(names, small.names());
  for (const std::string& n : small.names()) EXPECT_EQ(small.memory_line(n), big.memory_line(n));
  spec.distractors = 0;
  World core = World::generate(77, spec);
  EXPECT_EQ(core.names().size() + 40, big.names().size());
  EXPECT_EQ(big.names()[0], "agent");
  EXPECT_EQ(big.distractor_names().size(), 40u);
}

// ---- the rest ------------------------------------------------------------------------------

TEST(LlmTasks, JsonRoundTrip) {
  for (const std::string& t : task_names()) {
    Sample s = make_sample(t, 4, opts(300));
    Sample r = Sample::from_json(nlohmann::json::parse(s.to_json().dump()));
    EXPECT_EQ(r.to_json(), s.to_json());
    EXPECT_EQ(r.text(), s.text());
  }
  EXPECT_THROW(Sample::from_json(nlohmann::json{{"task", "mqar"}}), wm::Error);
}

TEST(LlmTasks, CorpusMixesAllTasks) {
  std::string a = sample_corpus(7, 60000), b = sample_corpus(7, 60000);
  EXPECT_EQ(a, b);
  EXPECT_GE(a.size(), 60000u);
  EXPECT_LT(a.size(), 60000u + 12000u);
  for (const char* marker : {"Recall:", "secret code", "<|im_start|>user", "Goal: put"})
    EXPECT_NE(a.find(marker), std::string::npos) << marker;
  EXPECT_NE(sample_corpus(8, 5000), sample_corpus(7, 5000));
}

TEST(LlmTasks, PrintExamples) {
  // With WM_LLM_TASKS_PRINT=1: one sample of each task at ~300 tokens (bytes/4), segment by segment.
  const bool print = std::getenv("WM_LLM_TASKS_PRINT") != nullptr;
  TokenCounter count = bytes_counter(4.0);
  for (const std::string& t : task_names()) {
    Sample s = make_sample(t, 11, opts(300));
    // Whole-text counting drifts from the per-segment sum the generator controls (see LengthsNearTarget).
    EXPECT_NEAR(static_cast<double>(count(s.text())), 300.0, (t == "mqar" ? 0.15 : 0.08) * 300) << t;
    if (!print) continue;
    std::cout << "===== " << t << " (seed 11, " << count(s.text()) << " tokens) =====\n";
    for (const Segment& g : s.segments)
      std::cout << "[" << g.id << " | " << g.kind << (g.target ? " | TARGET" : "") << "] " << g.text
                << (g.text.empty() || g.text.back() != '\n' ? "\n" : "");
  }
}

// ---- needles and facts (training aids) ------------------------------------------------------

// niah and multifact with at least two needles or facts whatever the length, as many as the
// length holds (at most 5 and 8), one question or probe each, every sample near its length.
TEST(LlmTasks, NeedlesAndFactsPlantSeveralInShortTexts) {
  std::map<int64_t, int> most_needles, most_facts;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    for (int64_t len : {128, 192, 256}) {
      const Sample n = make_sample("needles", seed, opts(len));
      EXPECT_EQ(n.task, "needles");
      const int needles = static_cast<int>(n.meta["needles"].size());
      EXPECT_GE(needles, 2) << seed;
      EXPECT_LE(needles, 5) << seed;
      EXPECT_EQ(static_cast<int>(n.targets().size()), needles);
      most_needles[len] = std::max(most_needles[len], needles);
      const Sample f = make_sample("facts", seed, opts(len));
      EXPECT_EQ(f.task, "facts");
      const int facts = static_cast<int>(f.meta["facts"].size());
      EXPECT_GE(facts, 2) << seed;
      EXPECT_EQ(static_cast<int>(f.targets().size()), facts);
      most_facts[len] = std::max(most_facts[len], facts);
      // The niah sample of the same seed and length plants one needle per 128 tokens at most.
      EXPECT_LE(static_cast<int>(make_sample("niah", seed, opts(len)).meta["needles"].size()), std::max<int64_t>(1, len / 128));
    }
  }
  EXPECT_EQ(most_needles[128], 2);
  EXPECT_EQ(most_needles[256], 5);
  EXPECT_GE(most_facts[256], 4);
}

// ---- copy (training aid) -------------------------------------------------------------------

TEST(LlmTasks, CopyRoundsRepeatTheirLists) {
  EXPECT_EQ(training_aid_names(), (std::vector<std::string>{"copy", "recall", "lookup", "needles", "facts"}));
  const std::regex line_re("^([a-z]+) ([0-9]{2})$");
  const std::set<std::string> pool(mqar_key_pool().begin(), mqar_key_pool().end());
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (int64_t len : {128, 1024}) {
      Sample s = make_sample("copy", seed, opts(len));
      const auto targets = s.targets();
      ASSERT_EQ(static_cast<int>(targets.size()), s.meta["rounds"].get<int>());
      ASSERT_GE(targets.size(), 1u);
      int items = 0;
      for (size_t t : targets) {
        ASSERT_GE(t, 2u);
        const std::string& list = s.segments[t - 2].text;
        ASSERT_EQ(list.rfind("List:\n", 0), 0u);
        EXPECT_EQ(s.segments[t - 1].text, "Copy:\n");
        // The answer is the round's lines (2..8 of them, distinct keys), in some order.
        std::vector<std::string> given = lines_of(list.substr(6)), repeated = lines_of(s.segments[t].text);
        EXPECT_GE(given.size(), 2u);
        EXPECT_LE(given.size(), 8u);
        items += static_cast<int>(given.size());
        std::set<std::string> keys;
        for (const std::string& line : given) {
          std::smatch m;
          ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
          EXPECT_TRUE(pool.count(m[1])) << line;
          EXPECT_TRUE(keys.insert(m[1]).second) << "key twice in a round: " << line;
        }
        std::sort(given.begin(), given.end());
        std::sort(repeated.begin(), repeated.end());
        EXPECT_EQ(given, repeated) << seed;
      }
      EXPECT_EQ(items, s.meta["items"].get<int>());
      // Within about one round (up to ~40 tokens) of the target.
      EXPECT_NEAR(static_cast<double>(segment_sum(s, bytes_counter(4.0))), static_cast<double>(len), 40.0);
    }
  }
  // Shuffled: over many rounds, some repeat is not in the list's order.
  Sample s = make_copy(5, opts(2048));
  bool reordered = false;
  for (size_t t : s.targets()) reordered |= lines_of(s.segments[t - 2].text.substr(6)) != lines_of(s.segments[t].text);
  EXPECT_TRUE(reordered);
  EXPECT_EQ(make_copy(3, opts(256)).text(), make_copy(3, opts(256)).text());
  EXPECT_NE(make_copy(3, opts(256)).text(), make_copy(4, opts(256)).text());
}

// ---- recall (training aid) -----------------------------------------------------------------

TEST(LlmTasks, RecallQueriesEveryPairOfABareList) {
  const std::regex line_re("^([a-z]+) ([0-9]{2})\n$");
  std::set<int> sizes;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Sample s = make_sample("recall", seed, opts(1024));  // the length is not followed
    const int n = s.meta["pairs"].get<int>();
    sizes.insert(n);
    ASSERT_GE(n, 2);
    ASSERT_LE(n, 8);
    // n pairs first (nothing before them), the header, then n query/answer pairs.
    ASSERT_EQ(s.segments.size(), static_cast<size_t>(3 * n + 1));
    std::map<std::string, std::string> value_of;
    for (int i = 0; i < n; ++i) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(s.segments[i].text, m, line_re)) << s.segments[i].text;
      EXPECT_EQ(s.segments[i].kind, "pair");
      EXPECT_TRUE(value_of.emplace(m[1], m[2]).second) << "key twice: " << m[1];
    }
    EXPECT_EQ(s.segments[n].text, "Recall:\n");
    std::set<std::string> asked;
    for (int j = 0; j < n; ++j) {
      const Segment& q = s.segments[n + 1 + 2 * j];
      const Segment& a = s.segments[n + 2 + 2 * j];
      ASSERT_TRUE(value_of.count(q.text)) << q.text;
      EXPECT_TRUE(asked.insert(q.text).second);
      EXPECT_TRUE(a.target);
      EXPECT_EQ(a.text, " " + value_of[q.text] + "\n");
    }
    EXPECT_EQ(s.targets().size(), static_cast<size_t>(n));
  }
  EXPECT_EQ(sizes.size(), 7u);  // every size 2..8 drawn in 40 samples
  GenOptions o = opts(64);
  o.mqar_pairs = 5;
  EXPECT_EQ(make_recall(9, o).meta["pairs"].get<int>(), 5);
  o.mqar_pairs = kMqarKeyPool + 1;
  EXPECT_THROW(make_recall(9, o), wm::Error);
  EXPECT_EQ(make_recall(3, opts(256)).text(), make_recall(3, opts(256)).text());
  EXPECT_NE(make_recall(3, opts(256)).text(), make_recall(4, opts(256)).text());
}

// ---- lookup (training aid) -----------------------------------------------------------------

TEST(LlmTasks, LookupQueriesEveryPairAndItsValuesSpanSeveralKinds) {
  const std::regex line_re("^([a-z]+) ([^\n]+)\n$");
  const std::regex number_re("^[0-9]{3,4}$"), word_re("^[A-Za-z]+$");
  const std::set<std::string> pool(mqar_key_pool().begin(), mqar_key_pool().end());
  int numbers = 0, words = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Sample s = make_sample("lookup", seed, opts(1024));  // the length is not followed
    const int n = s.meta["pairs"].get<int>();
    ASSERT_GE(n, 2);
    ASSERT_LE(n, 8);
    ASSERT_EQ(s.segments.size(), static_cast<size_t>(3 * n + 1));
    std::map<std::string, std::string> value_of;
    std::set<std::string> values;
    for (int i = 0; i < n; ++i) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(s.segments[i].text, m, line_re)) << s.segments[i].text;
      EXPECT_TRUE(pool.count(m[1])) << m[1];
      EXPECT_TRUE(value_of.emplace(m[1], m[2]).second) << "key twice: " << m[1];
      EXPECT_TRUE(values.insert(m[2]).second) << "value twice: " << m[2];
      const std::string v = m[2];
      if (std::regex_match(v, number_re)) ++numbers;
      else if (std::regex_match(v, word_re)) ++words;
      else ADD_FAILURE() << "value neither a 3-4 digit number nor a word: " << v;
    }
    EXPECT_EQ(s.segments[n].text, "Recall:\n");
    std::set<std::string> asked;
    for (int j = 0; j < n; ++j) {
      const Segment& q = s.segments[n + 1 + 2 * j];
      const Segment& a = s.segments[n + 2 + 2 * j];
      ASSERT_TRUE(value_of.count(q.text)) << q.text;
      EXPECT_TRUE(asked.insert(q.text).second);
      EXPECT_TRUE(a.target);
      EXPECT_EQ(a.text, " " + value_of[q.text] + "\n");
    }
  }
  EXPECT_GT(numbers, 20);
  EXPECT_GT(words, 40);
  EXPECT_EQ(make_lookup(3, opts(256)).text(), make_lookup(3, opts(256)).text());
  EXPECT_NE(make_lookup(3, opts(256)).text(), make_lookup(4, opts(256)).text());
  EXPECT_NE(make_lookup(3, opts(256)).text(), make_recall(3, opts(256)).text());
}

TEST(LlmTasks, MqarKeysComeFromTheFixedPool) {
  const auto& pool = mqar_key_pool();
  ASSERT_EQ(static_cast<int>(pool.size()), kMqarKeyPool);
  EXPECT_EQ(std::set<std::string>(pool.begin(), pool.end()).size(), pool.size());
  const std::set<std::string> in_pool(pool.begin(), pool.end());
  // A long target uses every key once, and the rest of the length is filler.
  Sample s = make_mqar(2, opts(4096));
  EXPECT_EQ(s.meta["pairs"].get<int>(), kMqarKeyPool);
  int filler = 0;
  for (const Segment& g : s.segments) {
    filler += g.kind == "filler";
    if (g.kind == "pair") EXPECT_TRUE(in_pool.count(g.text.substr(0, g.text.find(' ')))) << g.text;
  }
  EXPECT_GT(filler, 0);
  GenOptions o = opts(1024);
  o.mqar_pairs = kMqarKeyPool + 1;
  EXPECT_THROW(make_mqar(1, o), wm::Error);
}

}  // namespace
}  // namespace wm::llmtasks
