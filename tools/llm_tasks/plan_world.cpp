#include "tools/llm_tasks/plan_world.h"

#include <algorithm>
#include <set>

#include "runtime/error.h"
#include "tools/llm_tasks/rng.h"

namespace wm::llmtasks {

namespace {

const std::vector<std::string> kRooms = {"kitchen", "bedroom", "study",    "bathroom", "garage",  "cellar",
                                         "attic",   "pantry",  "library",  "office",   "nursery", "laundry",
                                         "workshop", "gym",    "studio",   "lounge"};
const std::vector<std::string> kContainers = {"drawer", "fridge", "cabinet", "box",    "chest",  "wardrobe",
                                              "cupboard", "basket", "crate", "safe",   "locker", "trunk",
                                              "bin",    "oven",   "dresser", "case"};
const std::vector<std::string> kFurniture = {"table",  "shelf",      "desk",    "bed",        "sofa",
                                             "counter", "bench",     "stool",   "sink",       "armchair",
                                             "nightstand", "sideboard", "workbench", "windowsill", "bookcase",
                                             "mantelpiece"};
const std::vector<std::string> kMaterials = {"oak", "pine", "steel", "wicker", "plastic", "glass", "cedar",
                                             "birch", "walnut", "maple"};
const std::vector<std::string> kMetals = {"brass", "iron",   "silver", "copper", "golden", "steel",
                                          "bronze", "tin",   "rusty",  "small",  "long",   "old",
                                          "black", "nickel", "chrome", "bent"};
const std::vector<std::string> kObjects = {"apple",  "banana", "mug",    "book",   "towel",  "pear",   "lemon",
                                           "spoon",  "candle", "plate",  "bottle", "hammer", "sock",   "scarf",
                                           "cup",    "bowl",   "tomato", "wallet", "phone",  "remote", "pencil",
                                           "glove",  "hat",    "ball",   "soap",   "brush",  "comb",   "onion"};
const std::vector<std::string> kDistractorColours = {"red",   "blue",  "green",  "yellow", "white", "black",
                                                     "brown", "grey",  "pink",   "purple", "orange", "striped"};
const std::vector<std::string> kDistractorNouns = {
    "marble", "button", "ribbon", "whistle", "sponge", "notebook", "jar",    "vase",    "toy",    "puzzle",
    "magnet", "torch",  "shell",  "stamp",   "thimble", "feather", "pebble", "coin",    "battery", "fork",
    "knife",  "lid",    "cloth",  "card",    "ticket",  "tape",    "rope",   "bag",     "glasses", "umbrella"};

// n names: the base words in random order, then "<modifier>-<base>" combinations; none in `used`
// (which receives them).
std::vector<std::string> draw_names(Rng& rng, const std::vector<std::string>& base,
                                    const std::vector<std::string>& modifiers, int n, std::set<std::string>& used) {
  std::vector<std::string> pool = base;
  rng.shuffle(pool);
  std::vector<std::string> combos;
  for (const auto& m : modifiers)
    for (const auto& b : base) combos.push_back(m + "-" + b);
  rng.shuffle(combos);
  pool.insert(pool.end(), combos.begin(), combos.end());
  std::vector<std::string> out;
  for (const std::string& p : pool) {
    if (static_cast<int>(out.size()) == n) break;
    if (used.insert(p).second) out.push_back(p);
  }
  WM_CHECK(static_cast<int>(out.size()) == n, "not enough names for ", n, " things");
  return out;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(' ', i);
    if (j == std::string::npos) j = s.size();
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

}  // namespace

nlohmann::json WorldSpec::to_json() const {
  return {{"rooms", rooms},   {"containers", containers}, {"furniture", furniture},
          {"locks", locks},   {"objects", objects},       {"distractors", distractors}};
}

WorldSpec WorldSpec::from_json(const nlohmann::json& j) {
  try {
    WorldSpec s;
    s.rooms = j.at("rooms").get<int>();
    s.containers = j.at("containers").get<int>();
    s.furniture = j.at("furniture").get<int>();
    s.locks = j.at("locks").get<int>();
    s.objects = j.at("objects").get<int>();
    s.distractors = j.at("distractors").get<int>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat("WorldSpec::from_json: ", e.what()));
  }
}

std::string Goal::text() const { return "put the " + object + (on ? " on the " : " in the ") + place; }

const World::Thing& World::thing(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(str_cat("World: no thing named '", name, "'"));
  return things_[it->second];
}

World::Thing& World::mut(const std::string& name) { return things_[index_.at(name)]; }

void World::add(Thing t) {
  WM_CHECK(!index_.count(t.name) && t.name != "agent", "duplicate name ", t.name);
  index_[t.name] = things_.size();
  things_.push_back(std::move(t));
}

bool World::fail(std::string* error, const std::string& why) const {
  if (error) *error = why;
  return false;
}

std::string World::room_of(const std::string& name) const {
  if (name == "agent") return agent_room_;
  const Thing& t = thing(name);
  if (t.kind == Kind::Door) return "hall";
  if (t.kind != Kind::Object) return t.room;
  if (t.holder.empty()) return agent_room_;
  if (std::find(rooms_.begin(), rooms_.end(), t.holder) != rooms_.end()) return t.holder;
  return thing(t.holder).room;
}

World World::generate(uint64_t seed, const WorldSpec& spec, Goal* designed_goal) {
  WM_CHECK(spec.rooms >= 1 && spec.rooms <= static_cast<int>(kRooms.size()), "rooms must be in [1, 16], got ",
           spec.rooms);
  WM_CHECK(spec.containers >= 1 && spec.containers <= 60, "containers must be in [1, 60], got ", spec.containers);
  WM_CHECK(spec.furniture >= 1 && spec.furniture <= 60, "furniture must be in [1, 60], got ", spec.furniture);
  WM_CHECK(spec.locks >= 0 && spec.locks <= std::min(14, spec.rooms + spec.containers),
           "locks must be in [0, min(14, rooms + containers)], got ", spec.locks);
  WM_CHECK(spec.objects >= 1 && spec.objects <= static_cast<int>(kObjects.size()), "objects must be in [1, 28], got ",
           spec.objects);
  WM_CHECK(spec.distractors >= 0, "distractors must be >= 0, got ", spec.distractors);

  Rng rng(hash_combine(seed, hash_string("plan-world-core")));
  World w;
  std::set<std::string> used = {"agent", "hall"};
  std::vector<std::string> lockables;
  const std::vector<std::string> holders = w.add_places(rng, spec, used, &lockables);
  const std::map<std::string, int> lock_index = w.add_locks(rng, spec, lockables, holders, used);
  const Goal goal = w.add_objects(rng, spec, holders, lock_index, used);
  if (designed_goal) *designed_goal = goal;

  // The agent starts in the hall or a room it can leave and re-enter.
  std::vector<std::string> starts;
  for (const std::string& r : w.rooms_)
    if (r == "hall" || !w.thing(r + "-door").locked) starts.push_back(r);
  w.agent_room_ = rng.pick(starts);

  for (const Thing& t : w.things_) w.order_.push_back(t.name);
  rng.shuffle(w.order_);
  w.order_.insert(w.order_.begin(), "agent");
  w.add_distractors(seed, spec.distractors, holders, used);
  return w;
}

std::vector<std::string> World::add_places(Rng& rng, const WorldSpec& spec, std::set<std::string>& used,
                                           std::vector<std::string>* lockables) {
  std::vector<std::string> room_pool = kRooms;
  rng.shuffle(room_pool);
  rooms_.push_back("hall");
  for (int i = 0; i < spec.rooms; ++i) {
    rooms_.push_back(room_pool[i]);
    used.insert(room_pool[i]);
  }
  std::vector<std::string> holders(rooms_);  // where portable things can be: floors first
  for (int i = 1; i <= spec.rooms; ++i) {
    Thing d;
    d.name = rooms_[i] + "-door";
    d.kind = Kind::Door;
    d.room = rooms_[i];
    used.insert(d.name);
    lockables->push_back(d.name);
    add(d);
  }
  for (const std::string& n : draw_names(rng, kContainers, kMaterials, spec.containers, used)) {
    Thing c;
    c.name = n;
    c.kind = Kind::Container;
    c.room = rng.pick(rooms_);
    c.open = rng.chance(0.25);
    holders.push_back(n);
    lockables->push_back(n);
    add(c);
  }
  for (const std::string& n : draw_names(rng, kFurniture, kMaterials, spec.furniture, used)) {
    Thing f;
    f.name = n;
    f.kind = Kind::Furniture;
    f.room = rng.pick(rooms_);
    holders.push_back(n);
    add(f);
  }
  return holders;
}

int World::guard(const std::string& h, const std::map<std::string, int>& lock_index) const {
  auto lock_of = [&](const std::string& n) {
    auto it = lock_index.find(n);
    return it == lock_index.end() ? -1 : it->second;
  };
  if (std::find(rooms_.begin(), rooms_.end(), h) != rooms_.end()) return h == "hall" ? -1 : lock_of(h + "-door");
  const Thing& t = thing(h);
  int g = t.room == "hall" ? -1 : lock_of(t.room + "-door");
  if (t.kind == Kind::Container) g = std::max(g, lock_of(h));
  return g;
}

std::vector<std::string> World::holders_guarded(const std::vector<std::string>& holders,
                                                const std::map<std::string, int>& lock_index,
                                                const std::function<bool(int)>& pred) const {
  std::vector<std::string> out;
  for (const std::string& h : holders)
    if (pred(guard(h, lock_index))) out.push_back(h);
  return out;
}

std::map<std::string, int> World::add_locks(Rng& rng, const WorldSpec& spec, std::vector<std::string> lockables,
                                            const std::vector<std::string>& holders, std::set<std::string>& used) {
  rng.shuffle(lockables);
  lockables.resize(spec.locks);
  std::map<std::string, int> lock_index;
  for (int i = 0; i < spec.locks; ++i) lock_index[lockables[i]] = i;
  std::vector<std::string> metals = kMetals;
  rng.shuffle(metals);
  for (int i = 0; i < spec.locks; ++i) {
    Thing& lock = mut(lockables[i]);
    lock.locked = true;
    lock.open = false;
    lock.key = metals[i] + "-key";
    used.insert(lock.key);
    std::vector<std::string> chain = holders_guarded(holders, lock_index, [&](int g) { return g == i - 1 && i > 0; });
    std::vector<std::string> allowed = holders_guarded(holders, lock_index, [&](int g) { return g < i; });
    Thing k;
    k.name = lock.key;
    k.kind = Kind::Object;
    k.is_key = true;
    k.holder = !chain.empty() && rng.chance(0.6) ? rng.pick(chain) : rng.pick(allowed);
    add(k);
  }
  return lock_index;
}

Goal World::add_objects(Rng& rng, const WorldSpec& spec, const std::vector<std::string>& holders,
                        const std::map<std::string, int>& lock_index, std::set<std::string>& used) {
  std::vector<std::string> objects = draw_names(rng, kObjects, {}, spec.objects, used);
  for (int i = 0; i < spec.objects; ++i) {
    Thing o;
    o.name = objects[i];
    o.kind = Kind::Object;
    std::vector<std::string> deep = holders_guarded(
        holders, lock_index, [&](int g) { return spec.locks > 0 && g == spec.locks - 1; });
    o.holder = i == 0 && !deep.empty() && rng.chance(0.75) ? rng.pick(deep) : rng.pick(holders);
    add(o);
  }
  Goal goal;
  goal.object = objects[0];
  std::vector<std::string> places;
  for (size_t i = rooms_.size(); i < holders.size(); ++i)
    if (holders[i] != thing(goal.object).holder) places.push_back(holders[i]);
  goal.place = rng.pick(places);
  goal.on = thing(goal.place).kind == Kind::Furniture;
  return goal;
}

void World::add_distractors(uint64_t seed, int n, const std::vector<std::string>& holders,
                            std::set<std::string>& used) {
  if (n <= 0) return;
  const uint64_t dseed = hash_combine(seed, hash_string("plan-world-distractors"));
  Rng pool_rng(dseed);
  std::vector<std::string> pool;
  for (const auto& c : kDistractorColours)
    for (const auto& noun : kDistractorNouns) pool.push_back(c + "-" + noun);
  for (const auto& m : kMetals) pool.push_back(m + "-key");
  pool_rng.shuffle(pool);
  size_t next = 0;
  int round = 1;
  for (int i = 0; i < n; ++i) {
    std::string name;
    do {
      if (next == pool.size()) {
        next = 0;
        ++round;
      }
      name = round == 1 ? pool[next] : str_cat(pool[next], "-", round);
      ++next;
    } while (used.count(name));
    used.insert(name);
    Rng r(hash_combine(dseed, static_cast<uint64_t>(i)));
    Thing d;
    d.name = name;
    d.kind = Kind::Object;
    d.is_key = name.size() > 4 && name.compare(name.size() - 4, 4, "-key") == 0;
    d.holder = r.pick(holders);
    add(d);
    distractors_.push_back(name);
    order_.insert(order_.begin() + 1 + static_cast<std::ptrdiff_t>(r.index(order_.size())), name);
  }
}

std::string World::memory_line(const std::string& name) const {
  if (name == "agent") return "{\"object\": \"agent\", \"position\": \"in the " + agent_room_ + "\"}";
  const Thing& t = thing(name);
  std::string pos;
  switch (t.kind) {
    case Kind::Door: pos = "in the hall"; break;
    case Kind::Container:
    case Kind::Furniture: pos = "in the " + t.room; break;
    case Kind::Object:
      if (t.holder.empty()) pos = "in hand";
      else if (std::find(rooms_.begin(), rooms_.end(), t.holder) != rooms_.end()) pos = "in the " + t.holder;
      else pos = (thing(t.holder).kind == Kind::Furniture ? "on the " : "in the ") + t.holder;
      break;
  }
  std::string line = "{\"object\": \"" + name + "\", \"position\": \"" + pos + "\"";
  if (t.kind == Kind::Door) line += std::string(", \"state\": \"") + (t.locked ? "locked" : "unlocked") + "\"";
  if (t.kind == Kind::Container)
    line += std::string(", \"state\": \"") + (t.locked ? "locked" : t.open ? "open" : "closed") + "\"";
  if (t.locked) line += ", \"key\": \"" + t.key + "\"";
  return line + "}";
}

std::vector<Segment> World::memory_lines() const {
  std::vector<Segment> out;
  out.reserve(order_.size());
  for (const std::string& n : order_) out.push_back(Segment{"mem:" + n, "state", memory_line(n) + "\n", false});
  return out;
}

bool World::execute(const std::string& action, std::string* error) {
  std::vector<std::string> w = split_words(action);
  for (const std::string& p : w)
    if (p.empty()) return fail(error, "malformed action '" + action + "'");
  const std::string& verb = w[0];
  auto args = [&](size_t n) { return w.size() == n + 1; };
  auto is_kind = [&](const std::string& n, Kind k) { return has(n) && thing(n).kind == k; };
  if (verb == "goto" && args(1)) {
    const std::string& r = w[1];
    if (std::find(rooms_.begin(), rooms_.end(), r) == rooms_.end()) return fail(error, "no room named " + r);
    if (r == agent_room_) return fail(error, "already in the " + r);
    if (r != "hall" && thing(r + "-door").locked) return fail(error, "the " + r + "-door is locked");
    agent_room_ = r;
    return true;
  }
  if ((verb == "open" || verb == "close") && args(1)) {
    const std::string& c = w[1];
    if (!is_kind(c, Kind::Container)) return fail(error, c + " is not a container");
    Thing& t = mut(c);
    if (t.room != agent_room_) return fail(error, "the " + c + " is not in the " + agent_room_);
    if (verb == "open") {
      if (t.locked) return fail(error, "the " + c + " is locked");
      if (t.open) return fail(error, "the " + c + " is already open");
      t.open = true;
    } else {
      if (!t.open) return fail(error, "the " + c + " is not open");
      t.open = false;
    }
    return true;
  }
  if (verb == "unlock" && args(1)) {
    const std::string& n = w[1];
    if (!is_kind(n, Kind::Door) && !is_kind(n, Kind::Container)) return fail(error, n + " has no lock");
    Thing& t = mut(n);
    if (!t.locked) return fail(error, "the " + n + " is not locked");
    if (!thing(t.key).holder.empty()) return fail(error, "the " + t.key + " is not in hand");
    if (t.kind == Kind::Door && agent_room_ != "hall") return fail(error, "doors are unlocked from the hall");
    if (t.kind == Kind::Container && t.room != agent_room_)
      return fail(error, "the " + n + " is not in the " + agent_room_);
    t.locked = false;
    return true;
  }
  if (verb == "take" && args(1)) {
    const std::string& o = w[1];
    if (!is_kind(o, Kind::Object)) return fail(error, o + " cannot be taken");
    const Thing& t = thing(o);
    if (t.holder.empty()) return fail(error, "the " + o + " is already in hand");
    if (room_of(o) != agent_room_) return fail(error, "the " + o + " is not in the " + agent_room_);
    if (has(t.holder) && thing(t.holder).kind == Kind::Container && !thing(t.holder).open)
      return fail(error, "the " + t.holder + " is closed");
    mut(o).holder.clear();
    return true;
  }
  if (verb == "put" && args(2)) {
    const std::string &o = w[1], &p = w[2];
    if (!is_kind(o, Kind::Object) || !thing(o).holder.empty()) return fail(error, "the " + o + " is not in hand");
    if (!is_kind(p, Kind::Container) && !is_kind(p, Kind::Furniture))
      return fail(error, p + " is not a container or furniture");
    const Thing& t = thing(p);
    if (t.room != agent_room_) return fail(error, "the " + p + " is not in the " + agent_room_);
    if (t.kind == Kind::Container && !t.open) return fail(error, "the " + p + " is closed");
    mut(o).holder = p;
    return true;
  }
  return fail(error, "unknown action '" + action + "'");
}

bool World::goal_done(const Goal& goal) const { return thing(goal.object).holder == goal.place; }

namespace {

// The oracle: stateless; each call decides from the current state. It fetches a lock's key before
// walking to what the lock guards, so the thing it walks to is reachable once there; progress is
// monotone (keys stay in hand, locks stay open, containers stay open), and keys are never behind
// their own or a later lock, so following it terminates.
class Oracle {
 public:
  Oracle(const World& w, std::vector<std::string>* support) : w_(w), support_(support) {}

  // Keys first: before walking to a thing behind a lock, get the lock's key; only then walk.
  std::string next(const Goal& g) {
    note("agent");
    note(g.object);
    if (!held(g.object)) return take(g.object);
    note(g.place);
    const World::Thing& p = w_.thing(g.place);
    if (p.kind == World::Kind::Container && p.locked && !held(p.key)) return take(p.key);
    if (w_.agent_room() != p.room) return reach(p.room);
    if (p.kind == World::Kind::Container && !p.open) return open(g.place);
    return "put " + g.object + " " + g.place;
  }

 private:
  void note(const std::string& n) {
    if (support_ && std::find(support_->begin(), support_->end(), n) == support_->end()) support_->push_back(n);
  }
  bool held(const std::string& n) {
    note(n);
    return w_.thing(n).holder.empty();
  }
  void deeper() { WM_CHECK(++depth_ < 256, "the oracle's key chain does not end (a key behind its own lock)"); }

  std::string reach(const std::string& room) {
    deeper();
    if (room == "hall") return "goto hall";
    const std::string door = room + "-door";
    note(door);
    const World::Thing& d = w_.thing(door);
    if (!d.locked) return "goto " + room;
    if (!held(d.key)) return take(d.key);
    if (w_.agent_room() != "hall") return "goto hall";
    return "unlock " + door;
  }

  std::string take(const std::string& obj) {
    deeper();
    note(obj);
    const World::Thing& t = w_.thing(obj);
    const bool in_thing = w_.has(t.holder);
    if (in_thing) note(t.holder);
    const bool in_container = in_thing && w_.thing(t.holder).kind == World::Kind::Container;
    if (in_container && w_.thing(t.holder).locked && !held(w_.thing(t.holder).key))
      return take(w_.thing(t.holder).key);
    const std::string room = w_.room_of(obj);
    if (w_.agent_room() != room) return reach(room);
    if (in_container && !w_.thing(t.holder).open) return open(t.holder);
    return "take " + obj;
  }

  std::string open(const std::string& c) {  // the agent is in c's room
    deeper();
    note(c);
    const World::Thing& t = w_.thing(c);
    if (!t.locked) return "open " + c;
    if (!held(t.key)) return take(t.key);
    return "unlock " + c;
  }

  const World& w_;
  std::vector<std::string>* support_;
  int depth_ = 0;
};

}  // namespace

std::string World::oracle_next_action(const Goal& goal, std::vector<std::string>* support) const {
  if (support) support->clear();
  if (goal_done(goal)) return "";
  return Oracle(*this, support).next(goal);
}

std::vector<std::string> World::solve(const Goal& goal, int max_steps) const {
  World w = *this;
  std::vector<std::string> actions;
  while (!w.goal_done(goal)) {
    WM_CHECK(static_cast<int>(actions.size()) < max_steps, "goal '", goal.text(), "' not done in ", max_steps,
             " steps");
    std::string a = w.oracle_next_action(goal);
    std::string err;
    WM_CHECK(w.execute(a, &err), "the oracle's action '", a, "' failed: ", err);
    actions.push_back(std::move(a));
  }
  return actions;
}

}  // namespace wm::llmtasks
