// plan: KEEP-style embodied planning samples built on World (plan_world.h). A house and a goal,
// the oracle's solution, a random point in it: the prompt there (rules, memory, goal, the actions
// so far) and the next 1..3 oracle actions as targets, with the memory lines each changed.
#include <algorithm>

#include "runtime/error.h"
#include "tools/llm_tasks/plan_world.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

namespace {

const std::string kRulesLong =
    "You control a robot in a house. The memory below has one JSON line per thing: where it is and, "
    "for doors and containers, whether it is locked, closed or open, and which key unlocks it. A "
    "later line about a thing replaces an earlier one. Every room has a door in the hall. At each "
    "step reply with one action:\n"
    "goto ROOM - walk to a room whose door is not locked.\n"
    "open CONTAINER - open a closed container in your room.\n"
    "unlock THING - unlock a door (from the hall) or a container (in your room) with its key in hand.\n"
    "take OBJECT - pick up an object in your room that is not in a closed container.\n"
    "put OBJECT PLACE - put an object from your hand into an open container or onto furniture in "
    "your room.\n"
    "close CONTAINER - close an open container in your room.\n";
const std::string kRulesShort =
    "Robot in a house. Memory: one JSON line per thing; a later line replaces an earlier one. Each "
    "step, one action: goto ROOM, open CONTAINER, unlock DOOR-OR-CONTAINER (key in hand; doors from "
    "the hall), take OBJECT, put OBJECT PLACE.\n";
// A worked episode (static text; it follows the rules above).
const std::string kExample =
    "Example.\n"
    "Memory:\n"
    "{\"object\": \"agent\", \"position\": \"in the hall\"}\n"
    "{\"object\": \"pantry-door\", \"position\": \"in the hall\", \"state\": \"locked\", \"key\": \"tin-key\"}\n"
    "{\"object\": \"crate\", \"position\": \"in the pantry\", \"state\": \"closed\"}\n"
    "{\"object\": \"bench\", \"position\": \"in the hall\"}\n"
    "{\"object\": \"tin-key\", \"position\": \"on the bench\"}\n"
    "{\"object\": \"pear\", \"position\": \"in the crate\"}\n"
    "Goal: put the pear on the bench.\n"
    "Step 1: take tin-key\n"
    "Step 2: unlock pantry-door\n"
    "Step 3: goto pantry\n"
    "Step 4: open crate\n"
    "Step 5: take pear\n"
    "Step 6: goto hall\n"
    "Step 7: put pear bench\n"
    "End of example.\n";
const std::string kMemoryHeader = "Memory:\n";

// Core sizes for a length budget (tokens), jittered.
WorldSpec spec_for(int64_t budget, Rng& rng) {
  WorldSpec s;
  auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return static_cast<int>(std::clamp(v, lo, hi)); };
  s.rooms = clamp((budget + 175) / 350 + rng.uniform_int(-1, 1), 1, 16);
  s.containers = clamp(s.rooms + rng.uniform_int(0, s.rooms / 2 + 1), 1, 60);
  s.furniture = clamp(s.rooms + rng.uniform_int(-1, 1), 1, 60);
  s.locks = clamp(1 + budget / 1200 + rng.uniform_int(0, 1), 1, std::min(14, s.rooms + s.containers));
  s.objects = clamp(1 + budget / 700 + rng.uniform_int(0, 1), 1, 28);
  return s;
}

std::string step_cue(int step) { return str_cat("Step ", step, ":"); }

// Names whose memory line differs between two states of the same house, in memory order.
std::vector<std::string> changed(const World& before, const World& after) {
  std::vector<std::string> out;
  for (const std::string& n : after.names())
    if (before.memory_line(n) != after.memory_line(n)) out.push_back(n);
  return out;
}

// A core house, its goal, the steps already taken (start) and the steps asked for (ntargets),
// with the tokens of the prompt they make.
struct PlanChoice {
  WorldSpec spec;
  Goal goal;
  uint64_t world_seed = 0;
  std::vector<std::string> solution;
  int start = 0, ntargets = 0;
  int64_t cost = 0;
};

// The tokens of the prompt of house w (start steps taken) past its rules: the memory header,
// goal, memory, the steps taken, then each target's cue and answer with the memory lines that
// change before the next.
int64_t prompt_cost(World w, const PlanChoice& c, const TokenCounter& count) {
  int64_t cost = count(kMemoryHeader) + count("Goal: " + c.goal.text() + ".\n");
  for (const Segment& m : w.memory_lines()) cost += count(m.text);
  for (int i = 0; i < c.start; ++i) cost += count(step_cue(i + 1) + " " + c.solution[i] + "\n");
  for (int j = 0; j < c.ntargets; ++j) {
    const int i = c.start + j;
    cost += count(step_cue(i + 1)) + count(" " + c.solution[i] + "\n");
    if (j + 1 < c.ntargets) {
      World next = w;
      next.execute(c.solution[i]);
      for (const std::string& n : changed(w, next)) cost += count(next.memory_line(n) + "\n");
      w = next;
    }
  }
  return cost;
}

// Finds a core house, goal, start step and target count whose prompt (with rules_cost for the
// rules) fits `target` tokens, shrinking the house on each failed attempt (8 at most: the last
// is kept even when it does not fit).
PlanChoice choose_plan(Rng& rng, const GenOptions& o, const TokenCounter& count, int64_t rules_cost) {
  const int64_t target = o.target_tokens;
  const uint64_t base_world_seed = rng.fork() & 0xFFFFFFFFFFFFull;
  PlanChoice c;
  const int kAttempts = 8;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    int64_t budget = target;
    for (int a = 0; a < attempt; ++a) budget = budget * 7 / 10;
    c.spec = spec_for(budget, rng);
    c.world_seed = hash_combine(base_world_seed, static_cast<uint64_t>(attempt)) & 0xFFFFFFFFFFFFull;
    World w = World::generate(c.world_seed, c.spec, &c.goal);
    c.solution = w.solve(c.goal, 500);
    const int L = static_cast<int>(c.solution.size());
    c.ntargets = std::min(o.plan_targets > 0 ? o.plan_targets : static_cast<int>(rng.uniform_int(1, 3)), L);
    c.start = static_cast<int>(rng.uniform_int(0, L - c.ntargets));
    for (int i = 0; i < c.start; ++i) w.execute(c.solution[i]);
    c.cost = rules_cost + prompt_cost(std::move(w), c, count);
    if (c.cost <= target) break;
  }
  return c;
}

// Distractor lines to fill the prompt up to `target` tokens (they never change and the oracle
// never reads them): how many, *cost growing by their tokens.
int distractors_to_fill(const PlanChoice& c, const TokenCounter& count, int64_t target, int64_t* cost) {
  int distractors = 0;
  if (*cost >= target) return 0;
  const int64_t line = std::max<int64_t>(1, count("{\"object\": \"red-pen\", \"position\": \"in the box\"}\n"));
  WorldSpec wide = c.spec;
  wide.distractors = static_cast<int>((target - *cost) / line) + 8;
  World big = World::generate(c.world_seed, wide);
  for (const std::string& n : big.distractor_names()) {
    int64_t t = count(big.memory_line(n) + "\n");
    if (!closer_with(*cost, t, target)) break;
    *cost += t;
    ++distractors;
  }
  return distractors;
}

}  // namespace

Sample make_plan(uint64_t seed, const GenOptions& o) {
  check_common(o, "plan");
  if (o.plan_targets < 0 || o.plan_targets > 16)
    throw Error(str_cat("plan: targets must be in [0, 16], got ", o.plan_targets));
  const TokenCounter count = counter_of(o);
  const int64_t target = o.target_tokens;
  Rng rng(hash_combine(seed, hash_string("plan")));

  const std::string& rules = target >= 768 ? kRulesLong : kRulesShort;
  PlanChoice c = choose_plan(rng, o, count, count(rules));
  int64_t cost = c.cost;
  const int64_t example_cost = count(kExample);
  const bool with_example = target >= 1024 && cost + example_cost <= target;
  if (with_example) cost += example_cost;
  c.spec.distractors = distractors_to_fill(c, count, target, &cost);
  const WorldSpec& spec = c.spec;
  const Goal& goal = c.goal;
  const std::vector<std::string>& solution = c.solution;
  const int start = c.start, ntargets = c.ntargets;
  const uint64_t world_seed = c.world_seed;

  Sample s;
  s.task = "plan";
  s.seed = seed;
  push_segment(s, "system", "system", rules);
  if (with_example) push_segment(s, "example", "example", kExample);
  push_segment(s, "memory", "static", kMemoryHeader);
  World w = World::generate(world_seed, spec);
  for (int i = 0; i < start; ++i) {
    std::string err;
    WM_CHECK(w.execute(solution[i], &err), "replaying '", solution[i], "': ", err);
  }
  for (Segment& m : w.memory_lines()) s.segments.push_back(std::move(m));
  push_segment(s, "goal", "instruction", "Goal: " + goal.text() + ".\n");
  for (int i = 0; i < start; ++i)
    push_segment(s, str_cat("step:", i + 1), "action", step_cue(i + 1) + " " + solution[i] + "\n");
  nlohmann::json jtargets = nlohmann::json::array();
  for (int j = 0; j < ntargets; ++j) {
    const int i = start + j;
    std::vector<std::string> support;
    const std::string action = w.oracle_next_action(goal, &support);
    WM_CHECK(action == solution[i], "the oracle's action changed with distractors: '", action, "' vs '",
             solution[i], "'");
    push_segment(s, str_cat("step:", i + 1), "cue", step_cue(i + 1));
    push_segment(s, str_cat("step:", i + 1, ":answer"), "answer", " " + action + "\n", true);
    jtargets.push_back({{"step", i + 1}, {"action", action}, {"support", support}});
    World next = w;
    std::string err;
    WM_CHECK(next.execute(action, &err), "the oracle's action '", action, "' failed: ", err);
    if (j + 1 < ntargets)
      for (const std::string& n : changed(w, next))
        push_segment(s, str_cat("step:", i + 1, ":mem:", n), "state", next.memory_line(n) + "\n");
    w = std::move(next);
  }
  s.meta = {{"world_seed", world_seed},
            {"spec", spec.to_json()},
            {"goal", {{"object", goal.object}, {"place", goal.place}, {"on", goal.on}, {"text", goal.text()}}},
            {"start_step", start},
            {"solution", solution},
            {"targets", jtargets},
            {"example", with_example},
            {"tokens", cost},
            {"target_tokens", target}};
  return s;
}

}  // namespace wm::llmtasks
