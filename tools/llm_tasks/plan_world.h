#pragma once
// The text house of the `plan` task, reusable for an interactive benchmark: a hall and rooms
// (each behind its own door, all doors in the hall), furniture and containers standing in rooms,
// portable objects on the floor, on furniture or in containers, keys for locked doors and locked
// containers. An agent walks between rooms and manipulates things with a fixed skill grammar:
//
//   goto <room>                 the room's door must not be locked (goto hall always works)
//   open <container>            in the agent's room; closed, not locked
//   close <container>           in the agent's room; open
//   unlock <door|container>     its key in hand; a door from the hall, a container in its room;
//                               a door becomes "unlocked", a container "closed"
//   take <object>               in the agent's room, not inside a closed container
//   put <object> <place>        the object in hand; place = a container (open) or furniture in
//                               the agent's room
//
// Names are single words (hyphens allowed: "study-door", "brass-key", "red-marble"). The memory
// is one JSON line per thing, in a fixed order (the agent first):
//   {"object": "agent", "position": "in the hall"}
//   {"object": "study-door", "position": "in the hall", "state": "locked", "key": "brass-key"}
//   {"object": "drawer", "position": "in the bedroom", "state": "closed"}
//   {"object": "table", "position": "in the kitchen"}
//   {"object": "brass-key", "position": "in the drawer"}      (a container: "in the", furniture:
//   {"object": "apple", "position": "on the table"}            "on the", a room: "in the",
//   {"object": "pear", "position": "in hand"}                  the agent's hand: "in hand")
// Keys are always reachable: the key of the i-th lock is never behind that lock or a later one,
// so every goal is solvable and the oracle never cycles.
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/llm_tasks/sample.h"

namespace wm::llmtasks {

class Rng;

// Sizes of a generated house. generate() checks the ranges.
struct WorldSpec {
  int rooms = 3;        // besides the hall, 1..16
  int containers = 3;   // openable containers, 1..60
  int furniture = 2;    // surfaces, 1..60
  int locks = 1;        // locked doors or containers, each with its own key, 0..min(14, rooms + containers)
  int objects = 2;      // ordinary portable objects (goal candidates), 1..28
  int distractors = 0;  // further portable objects (no role in the designed goal), >= 0. The house
                        // with n distractors is the house with n - 1 plus one more line.

  nlohmann::json to_json() const;
  static WorldSpec from_json(const nlohmann::json& j);  // throws wm::Error
};

// "put <object> in/on <place>": done when the object is in or on the place.
struct Goal {
  std::string object;
  std::string place;
  bool on = false;  // the place is furniture ("on the"), otherwise a container ("in the")
  std::string text() const;  // "put the apple in the fridge"
};

class World {
 public:
  enum class Kind { Door, Container, Furniture, Object };
  struct Thing {
    std::string name;
    Kind kind = Kind::Object;
    std::string room;    // Door: the room it leads to; Container, Furniture: the room it stands in
    std::string holder;  // Object: a room, container or furniture name; "" when in the agent's hand
    bool is_key = false;
    bool open = false;    // Container
    bool locked = false;  // Door, Container
    std::string key;      // Door, Container: the key that unlocks it (while locked)
  };

  // A house from the seed and sizes, with the goal it was designed around (placed behind the last
  // lock or further, so that reaching it often takes a chain of keys). Deterministic.
  static World generate(uint64_t seed, const WorldSpec& spec, Goal* designed_goal = nullptr);

  // The memory: one segment per thing, id "mem:<name>", kind "state", text = the JSON line + "\n".
  std::vector<Segment> memory_lines() const;
  // The JSON line of one thing (without the newline); throws wm::Error for an unknown name.
  std::string memory_line(const std::string& name) const;
  // Names in memory order ("agent" first).
  const std::vector<std::string>& names() const { return order_; }

  // Carries out one action of the skill grammar. On failure returns false, leaves the state as it
  // was and, when error is not null, says why.
  bool execute(const std::string& action, std::string* error = nullptr);

  bool goal_done(const Goal& goal) const;
  // The next action of a shortest-minded plan for the goal ("" when it is done). When support is
  // not null it receives the names whose memory lines the decision read, in the order read.
  std::string oracle_next_action(const Goal& goal, std::vector<std::string>* support = nullptr) const;
  // The oracle's actions from the current state until the goal is done, at most max_steps; throws
  // wm::Error when the goal is not done by then.
  std::vector<std::string> solve(const Goal& goal, int max_steps = 200) const;

  // The distractor objects, in the order they were added (WorldSpec::distractors).
  const std::vector<std::string>& distractor_names() const { return distractors_; }
  const std::string& agent_room() const { return agent_room_; }
  const std::vector<std::string>& rooms() const { return rooms_; }  // the hall first
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const Thing& thing(const std::string& name) const;  // throws wm::Error for an unknown name
  // The room an object (or anything else) is in; the agent's room for a held object.
  std::string room_of(const std::string& name) const;

 private:
  Thing& mut(const std::string& name);
  void add(Thing t);
  bool fail(std::string* error, const std::string& why) const;

  // generate()'s steps, in this order, on the world being made (`used` holds every name taken).
  // The hall and spec.rooms rooms, their doors, the containers and the furniture; returns where
  // portable things can lie (the floors first, then containers and furniture); *lockables gets
  // the doors and containers.
  std::vector<std::string> add_places(Rng& rng, const WorldSpec& spec, std::set<std::string>& used,
                                      std::vector<std::string>* lockables);
  // Locks spec.locks of the lockables, in a random order, and lays the key of the i-th where
  // only locks before it guard it. Returns each lock's index in that order.
  std::map<std::string, int> add_locks(Rng& rng, const WorldSpec& spec, std::vector<std::string> lockables,
                                       const std::vector<std::string>& holders, std::set<std::string>& used);
  // The ordinary objects; the first is the designed goal's, behind the last lock when it can be.
  // Returns that goal.
  Goal add_objects(Rng& rng, const WorldSpec& spec, const std::vector<std::string>& holders,
                   const std::map<std::string, int>& lock_index, std::set<std::string>& used);
  // n distractors, into things_ and order_: the i-th depends on (seed, i) only, so fewer
  // distractors give a prefix.
  void add_distractors(uint64_t seed, int n, const std::vector<std::string>& holders, std::set<std::string>& used);
  // The highest lock index guarding holder h (its room's door, or it as a container); -1: none.
  int guard(const std::string& h, const std::map<std::string, int>& lock_index) const;
  // The holders whose guard satisfies pred.
  std::vector<std::string> holders_guarded(const std::vector<std::string>& holders,
                                           const std::map<std::string, int>& lock_index,
                                           const std::function<bool(int)>& pred) const;

  std::vector<Thing> things_;
  std::map<std::string, size_t> index_;
  std::vector<std::string> rooms_;
  std::vector<std::string> order_;
  std::vector<std::string> distractors_;
  std::string agent_room_;
};

}  // namespace wm::llmtasks
