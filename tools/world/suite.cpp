#include "tools/world/suite.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "tools/world/rng.h"

namespace wm::world {

using nlohmann::json;

Suite generate_suite(uint64_t seed, int count, const SuiteOptions& options, const std::function<void(int, int)>& progress) {
  if (count < 1 || count > 100000)
    throw wm::Error("generate_suite: count: expected 1..100000, got " + std::to_string(count));
  validate(options.trajectory);
  Suite s;
  s.name = options.name;
  s.fps = options.trajectory.fps;
  s.render = options.trajectory.render;
  s.criteria = options.trajectory.criteria;
  s.gen_seed = seed;
  s.gen_count = count;
  s.source = "gen:" + std::to_string(seed) + ":" + std::to_string(count);
  for (int i = 0; i < count; ++i) {
    Episode ep = generate_episode(json_safe_seed(hash_combine(seed, static_cast<uint64_t>(i))), options.trajectory);
    char buf[32];
    std::snprintf(buf, sizeof buf, "/%03d", i);
    ep.name = s.name + buf;
    s.episodes.push_back(std::move(ep));
    if (progress) progress(i + 1, count);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Writing.

namespace {

double round_to(double v, int decimals) {
  double f = std::pow(10.0, decimals);
  double r = std::round(v * f) / f;
  return r == 0 ? 0.0 : r;  // no "-0"
}

json pose_json(const Pose& p, int decimals) {
  json a = json::array({round_to(p.x, decimals), round_to(p.y, decimals), round_to(p.yaw_deg, decimals)});
  if (p.pitch_deg != 0) a.push_back(round_to(p.pitch_deg, decimals));
  return a;
}

json world_json(const WorldParams& w) {
  return json{{"seed", w.seed},         {"layout", w.layout},       {"width", w.width},         {"height", w.height},
              {"rooms", w.rooms},       {"room_min", w.room_min},   {"room_max", w.room_max},   {"block_min", w.block_min},
              {"block_max", w.block_max}, {"pillars", w.pillars},   {"extra_links", w.extra_links}, {"landmarks", w.landmarks}};
}

// Key order kept as written (nlohmann's json sorts keys; ordered_json keeps insertion order).
std::string episode_text(const Episode& ep, const SaveOptions& o, const std::string& indent) {
  std::ostringstream s;
  s << indent << "{\"name\": " << json(ep.name).dump() << ",\n";
  s << indent << " \"world\": " << world_json(ep.world).dump() << ",\n";
  s << indent << " \"motion\": "
    << nlohmann::ordered_json{{"speed", ep.motion.speed}, {"radius", ep.motion.radius}, {"max_pitch_deg", ep.motion.max_pitch_deg}}.dump()
    << ",\n";
  s << indent << " \"start\": " << pose_json(ep.start, 9).dump() << ",\n";
  s << indent << " \"frames\": " << ep.frames() << ",\n";
  json runs = json::array();
  for (const ActionRun& r : encode_runs(ep.actions)) {
    json a = json::array({r.count, keys_of(r.action), r.action.dyaw_deg});
    if (r.action.dpitch_deg != 0) a.push_back(r.action.dpitch_deg);
    runs.push_back(a);
  }
  s << indent << " \"actions\": " << runs.dump() << ",\n";
  if (o.pose_every > 0) {
    json vals = json::array();
    for (size_t t = 0; t < ep.poses.size(); t += static_cast<size_t>(o.pose_every)) vals.push_back(pose_json(ep.poses[t], o.pose_decimals));
    s << indent << " \"poses\": {\"every\": " << o.pose_every << ", \"decimals\": " << o.pose_decimals
      << ", \"values\": " << vals.dump() << "},\n";
  }
  json rv = json::array();
  for (const RevisitPair& p : ep.revisits) rv.push_back({p.first, p.revisit});
  s << indent << " \"revisits\": " << rv.dump();
  if (o.segments && !ep.segments.empty()) {
    json sg = json::array();
    for (const Segment& g : ep.segments) sg.push_back({g.kind, g.start, g.end});
    s << ",\n" << indent << " \"segments\": " << sg.dump();
  }
  s << "}";
  return s.str();
}

}  // namespace

std::string suite_to_json(const Suite& suite, const SaveOptions& o) {
  if (o.pose_every < 0) throw wm::Error("SaveOptions.pose_every: expected >= 0, got " + std::to_string(o.pose_every));
  if (o.pose_decimals < 0 || o.pose_decimals > 12)
    throw wm::Error("SaveOptions.pose_decimals: expected 0..12, got " + std::to_string(o.pose_decimals));
  using oj = nlohmann::ordered_json;
  std::ostringstream s;
  s << "{\"format\": \"wm.world.suite\", \"version\": 1, \"name\": " << json(suite.name).dump() << ",\n";
  s << " \"generator\": " << oj{{"seed", suite.gen_seed}, {"count", suite.gen_count}}.dump() << ",\n";
  s << " \"fps\": " << suite.fps << ",\n";
  s << " \"render\": "
    << oj{{"width", suite.render.width}, {"height", suite.render.height}, {"fov_deg", suite.render.fov_deg},
          {"supersample", suite.render.supersample}}.dump()
    << ",\n";
  const RevisitCriteria& c = suite.criteria;
  s << " \"revisit\": "
    << oj{{"pos_tol", c.pos_tol}, {"yaw_tol_deg", c.yaw_tol_deg}, {"pitch_tol_deg", c.pitch_tol_deg},
          {"min_gap_frames", c.min_gap_frames}, {"away_dist", c.away_dist}, {"away_yaw_deg", c.away_yaw_deg}}.dump()
    << ",\n";
  s << " \"episodes\": [\n";
  for (size_t i = 0; i < suite.episodes.size(); ++i) {
    s << episode_text(suite.episodes[i], o, "  ");
    s << (i + 1 < suite.episodes.size() ? ",\n" : "\n");
  }
  s << " ]}\n";
  return s.str();
}

void save_suite(const Suite& suite, const std::string& path, const SaveOptions& options) {
  std::string text = suite_to_json(suite, options);
  std::ofstream f(path, std::ios::binary);
  if (!f) throw wm::Error(path + ": cannot open for writing");
  f << text;
  f.close();
  if (!f) throw wm::Error(path + ": write failed");
}

// ---------------------------------------------------------------------------------------------
// Reading.

namespace {

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "integer " + v.dump();
  if (v.is_number()) return "number " + v.dump();
  std::string d = v.dump();
  if (d.size() > 40) d = d.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + d;
}

// A JSON value with its location for error messages ("file: episodes[2].actions[5]").
struct Node {
  const json& v;
  std::string src, path;

  [[noreturn]] void fail(const std::string& what) const {
    throw wm::Error(src + ": " + (path.empty() ? std::string("(top level)") : path) + ": " + what);
  }
  [[noreturn]] void expected(const std::string& what) const { fail("expected " + what + ", got " + type_name(v)); }
  bool has(const std::string& key) const { return v.is_object() && v.contains(key); }
  Node operator[](const std::string& key) const {
    if (!v.is_object()) expected("an object");
    auto it = v.find(key);
    if (it == v.end()) fail("missing field \"" + key + "\"");
    return {*it, src, path.empty() ? key : path + "." + key};
  }
  Node operator[](size_t i) const {
    if (!v.is_array()) expected("an array");
    if (i >= v.size()) fail("missing element " + std::to_string(i) + " (array has " + std::to_string(v.size()) + ")");
    return {v[i], src, path + "[" + std::to_string(i) + "]"};
  }
  size_t size() const {
    if (!v.is_array()) expected("an array");
    return v.size();
  }
  const std::string& str() const {
    if (!v.is_string()) expected("a string");
    return v.get_ref<const std::string&>();
  }
  double num() const {
    if (!v.is_number()) expected("a number");
    double d = v.get<double>();
    if (!std::isfinite(d)) expected("a finite number");
    return d;
  }
  double num(double lo, double hi) const {
    double d = num();
    if (!(d >= lo && d <= hi)) fail("expected a number in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + v.dump());
    return d;
  }
  int64_t integer(int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) expected("an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    return i;
  }
  uint64_t uinteger() const {
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      expected("a non-negative integer");
    return v.get<uint64_t>();
  }
};

// Wraps the wm::Error of a validate() call with the location.
template <typename F>
void at(const Node& n, F&& f) {
  try {
    f();
  } catch (const wm::Error& e) {
    n.fail(e.what());
  }
}

Pose read_pose(const Node& n) {
  size_t k = n.size();
  if (k != 3 && k != 4) n.fail("expected [x, y, yaw_deg] or [x, y, yaw_deg, pitch_deg], got " + std::to_string(k) + " elements");
  Pose p;
  p.x = n[0].num(-1e6, 1e6);
  p.y = n[1].num(-1e6, 1e6);
  p.yaw_deg = n[2].num(-1e6, 1e6);
  if (k == 4) p.pitch_deg = n[3].num(-90, 90);
  return p;
}

WorldParams read_world(const Node& n) {
  WorldParams w;
  w.seed = n["seed"].uinteger();
  w.layout = n["layout"].str();
  w.width = static_cast<int>(n["width"].integer(8, 128));
  w.height = static_cast<int>(n["height"].integer(8, 128));
  w.rooms = static_cast<int>(n["rooms"].integer(1, 64));
  w.room_min = static_cast<int>(n["room_min"].integer(2, 32));
  w.room_max = static_cast<int>(n["room_max"].integer(2, 32));
  w.block_min = static_cast<int>(n["block_min"].integer(1, 16));
  w.block_max = static_cast<int>(n["block_max"].integer(1, 16));
  w.pillars = n["pillars"].num(0, 1);
  w.extra_links = n["extra_links"].num(0, 1);
  w.landmarks = static_cast<int>(n["landmarks"].integer(0, 32));
  at(n, [&] { validate(w); });
  return w;
}

void read_header(const Node& n, Suite& s) {
  s.fps = static_cast<int>(n["fps"].integer(1, 240));
  Node r = n["render"];
  s.render.width = static_cast<int>(r["width"].integer(1, 8192));
  s.render.height = static_cast<int>(r["height"].integer(1, 8192));
  s.render.fov_deg = r["fov_deg"].num(10, 170);
  s.render.supersample = r.has("supersample") ? static_cast<int>(r["supersample"].integer(1, 8)) : 1;
  Node c = n["revisit"];
  s.criteria.pos_tol = c["pos_tol"].num(0, 1);
  s.criteria.yaw_tol_deg = c["yaw_tol_deg"].num(0, 45);
  s.criteria.pitch_tol_deg = c.has("pitch_tol_deg") ? c["pitch_tol_deg"].num(0, 45) : s.criteria.pitch_tol_deg;
  s.criteria.min_gap_frames = static_cast<int>(c["min_gap_frames"].integer(1, 1 << 30));
  s.criteria.away_dist = c["away_dist"].num(0, 1e6);
  s.criteria.away_yaw_deg = c["away_yaw_deg"].num(0, 180);
  at(c, [&] { validate(s.criteria); });
}

Episode read_episode(const Node& n, const Suite& suite, const LoadOptions& o) {
  Episode ep;
  if (!n.v.is_object()) n.expected("an episode object");
  ep.name = n.has("name") ? n["name"].str() : std::string();
  ep.world = read_world(n["world"]);
  if (n.has("motion")) {
    Node m = n["motion"];
    ep.motion.speed = m["speed"].num(0, 1);
    ep.motion.radius = m["radius"].num(0, 0.5);
    ep.motion.max_pitch_deg = m.has("max_pitch_deg") ? m["max_pitch_deg"].num(0, 90) : ep.motion.max_pitch_deg;
    at(m, [&] { validate(ep.motion); });
  }
  ep.start = read_pose(n["start"]);
  Node acts = n["actions"];
  std::vector<ActionRun> runs;
  int64_t total = 0;
  for (size_t i = 0; i < acts.size(); ++i) {
    Node r = acts[i];
    size_t k = r.size();
    if (k != 3 && k != 4) r.fail("expected [count, \"keys\", dyaw_deg] or [count, \"keys\", dyaw_deg, dpitch_deg], got " + std::to_string(k) + " elements");
    ActionRun run;
    run.count = static_cast<int>(r[0].integer(1, 1 << 24));
    Node keys = r[1];
    const std::string& key_text = keys.str();  // not a string: fails with its own location
    try {
      parse_keys(key_text, run.action);
    } catch (const wm::Error& e) {
      keys.fail(e.what());
    }
    run.action.dyaw_deg = r[2].num(-180, 180);
    if (k == 4) run.action.dpitch_deg = r[3].num(-90, 90);
    total += run.count;
    if (total > (1 << 24)) r.fail("trajectory longer than 2^24 frames");
    runs.push_back(run);
  }
  ep.actions = decode_runs(runs);
  if (n.has("frames")) {
    int64_t f = n["frames"].integer(0, 1 << 24);
    if (f != ep.frames()) n["frames"].fail("expected the number of frames the actions hold (" + std::to_string(ep.frames()) + "), got " + std::to_string(f));
  }
  if (ep.actions.empty()) acts.fail("expected at least one action, got none");

  Scene scene = generate_scene(ep.world);
  {
    int cx = static_cast<int>(std::floor(ep.start.x)), cy = static_cast<int>(std::floor(ep.start.y));
    if (scene.is_solid(cx, cy)) n["start"].fail("start pose " + to_string(ep.start) + " is inside a wall of the scene");
  }
  derive_poses(ep, scene);

  if (n.has("poses") && o.verify_poses) {
    Node ps = n["poses"];
    int every = static_cast<int>(ps["every"].integer(1, 1 << 24));
    int decimals = static_cast<int>(ps["decimals"].integer(0, 12));
    Node vals = ps["values"];
    size_t expect = (ep.poses.size() + every - 1) / every;
    if (vals.size() != expect)
      vals.fail("expected " + std::to_string(expect) + " poses (" + std::to_string(ep.poses.size()) + " frames, every " +
                std::to_string(every) + "), got " + std::to_string(vals.size()));
    double tol = 0.5 * std::pow(10.0, -decimals) + 1e-6;
    for (size_t k = 0; k < vals.size(); ++k) {
      Pose stored = read_pose(vals[k]);
      const Pose& d = ep.poses[k * every];
      if (std::fabs(stored.x - d.x) > tol || std::fabs(stored.y - d.y) > tol || yaw_diff_deg(stored.yaw_deg, d.yaw_deg) > tol ||
          std::fabs(stored.pitch_deg - d.pitch_deg) > tol)
        vals[k].fail("stored pose " + to_string(stored) + " of frame " + std::to_string(k * every) +
                     " differs from the pose the actions give " + to_string(d) + " (tolerance " + std::to_string(tol) + ")");
    }
  }
  Node rv = n["revisits"];
  for (size_t i = 0; i < rv.size(); ++i) {
    Node pr = rv[i];
    if (pr.size() != 2) pr.fail("expected [first, revisit], got " + std::to_string(pr.size()) + " elements");
    RevisitPair p{static_cast<int>(pr[0].integer(0, ep.frames() - 1)), static_cast<int>(pr[1].integer(0, ep.frames() - 1))};
    if (o.verify_revisits && !is_revisit(ep.poses, p, suite.criteria)) {
      const Pose &a = ep.poses[p.first], &b = ep.poses[p.revisit];
      pr.fail("frames " + std::to_string(p.first) + " and " + std::to_string(p.revisit) +
              " are not a revisit under the suite's criteria (gap " + std::to_string(p.revisit - p.first) + " frames, min " +
              std::to_string(suite.criteria.min_gap_frames) + "; poses " + to_string(a) + " vs " + to_string(b) +
              "; or the camera never looked or walked away in between)");
    }
    ep.revisits.push_back(p);
  }
  if (n.has("segments")) {
    Node sg = n["segments"];
    for (size_t i = 0; i < sg.size(); ++i) {
      Node g = sg[i];
      if (g.size() != 3) g.fail("expected [\"kind\", start, end], got " + std::to_string(g.size()) + " elements");
      Segment seg{g[0].str(), static_cast<int>(g[1].integer(0, ep.frames())), static_cast<int>(g[2].integer(0, ep.frames()))};
      if (seg.end < seg.start) g.fail("expected start <= end, got " + std::to_string(seg.start) + " > " + std::to_string(seg.end));
      ep.segments.push_back(seg);
    }
  }
  return ep;
}

}  // namespace

Suite suite_from_json(const std::string& text, const std::string& source, const LoadOptions& o) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1E99999
    throw wm::Error(source + ": not valid JSON: " + e.what());
  }
  Node top{doc, source, ""};
  if (!doc.is_object()) top.expected("a JSON object (a suite or an episode)");
  const std::string& format = top["format"].str();
  if (format != "wm.world.suite" && format != "wm.world.episode")
    top["format"].fail("expected \"wm.world.suite\" or \"wm.world.episode\", got \"" + format + "\"");
  int64_t version = top["version"].integer(0, 1 << 30);
  if (version != 1) top["version"].fail("expected 1, got " + std::to_string(version));
  Suite s;
  s.source = source;
  read_header(top, s);
  if (format == "wm.world.episode") {
    s.episodes.push_back(read_episode(top, s, o));
    s.name = s.episodes.back().name.empty() ? source : s.episodes.back().name;
    return s;
  }
  s.name = top.has("name") ? top["name"].str() : source;
  if (top.has("generator")) {
    Node g = top["generator"];
    if (g.has("seed")) s.gen_seed = g["seed"].uinteger();
    if (g.has("count")) s.gen_count = static_cast<int>(g["count"].integer(0, 1 << 30));
  }
  Node eps = top["episodes"];
  if (eps.size() == 0) eps.fail("expected at least one episode, got none");
  for (size_t i = 0; i < eps.size(); ++i) s.episodes.push_back(read_episode(eps[i], s, o));
  return s;
}

Suite load_suite(const std::string& path, const LoadOptions& options) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw wm::Error(path + ": cannot open suite file");
  std::stringstream ss;
  ss << f.rdbuf();
  return suite_from_json(ss.str(), path, options);
}

Suite load_or_generate_suite(const std::string& spec, const LoadOptions& options) {
  if (spec.rfind("gen:", 0) == 0) {
    auto fail = [&](const std::string& why) {
      throw wm::Error("suite spec \"" + spec + "\": " + why + " (expected gen:SEED:COUNT, e.g. gen:7:10)");
    };
    std::string rest = spec.substr(4);
    size_t colon = rest.find(':');
    if (colon == std::string::npos) fail("missing COUNT");
    std::string a = rest.substr(0, colon), b = rest.substr(colon + 1);
    auto all_digits = [](const std::string& t) { return !t.empty() && t.size() <= 19 && t.find_first_not_of("0123456789") == std::string::npos; };
    if (!all_digits(a)) fail("SEED \"" + a + "\" is not a non-negative integer");
    if (!all_digits(b) || b.size() > 6) fail("COUNT \"" + b + "\" is not an integer in 1..100000");
    uint64_t seed = std::stoull(a);
    int count = std::stoi(b);
    if (count < 1 || count > 100000) fail("COUNT " + b + " is not in 1..100000");
    SuiteOptions so;
    so.name = "gen-" + a;
    Suite s = generate_suite(seed, count, so);
    s.source = spec;
    return s;
  }
  return load_suite(spec, options);
}

}  // namespace wm::world
