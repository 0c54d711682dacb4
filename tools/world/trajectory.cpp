#include "tools/world/trajectory.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <queue>

#include "runtime/error.h"
#include "tools/media/metrics.h"
#include "tools/world/rng.h"

namespace wm::world {

void validate(const TrajectoryOptions& o) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    throw wm::Error("TrajectoryOptions." + field + ": expected " + expected + ", got " + got);
  };
  if (o.fps < 1 || o.fps > 240) bad("fps", "1..240", std::to_string(o.fps));
  if (o.min_seconds < 1 || o.max_seconds < o.min_seconds || o.max_seconds > 3600)
    bad("min_seconds/max_seconds", "1 <= min <= max <= 3600", std::to_string(o.min_seconds) + "/" + std::to_string(o.max_seconds));
  if (o.max_attempts < 1) bad("max_attempts", ">= 1", std::to_string(o.max_attempts));
  validate(o.criteria);
  validate(o.render);
}

void derive_poses(Episode& ep, const Scene& scene) { ep.poses = integrate(scene, ep.motion, ep.start, ep.actions); }

std::vector<double> revisit_psnrs(const Episode& ep, const Scene& scene, const RenderSpec& spec) {
  Raycaster rc(scene, spec);
  std::vector<double> out;
  wm::Image a, b;
  for (const RevisitPair& p : ep.revisits) {
    if (p.first < 0 || p.revisit >= static_cast<int>(ep.poses.size()) || p.first >= p.revisit)
      throw wm::Error("revisit_psnrs: pair (" + std::to_string(p.first) + ", " + std::to_string(p.revisit) +
                      ") out of range for " + std::to_string(ep.poses.size()) + " poses");
    rc.render(ep.poses[p.first], a);
    rc.render(ep.poses[p.revisit], b);
    out.push_back(wm::media::psnr(a, b));
  }
  return out;
}

namespace {

using Cell = std::pair<int, int>;
const int kDir[4][2] = {{1, 0}, {0, 1}, {-1, 0}, {0, -1}};  // yaw 0, 90, 180, -90
double dir_yaw(int d) { return wrap_deg(90.0 * d); }

class Planner {
 public:
  Planner(const Scene& s, const MotionParams& m, Rng& rng) : s_(s), m_(m), rng_(rng) {}

  Pose pose;
  std::vector<Action> actions;
  std::vector<Segment> segments;
  struct Anchor { int frame; Pose pose; };
  std::vector<Anchor> anchors;  // on-lattice poses seen earlier, for "return" segments

  int frames() const { return static_cast<int>(actions.size()); }
  Cell cell() const { return {static_cast<int>(std::floor(pose.x)), static_cast<int>(std::floor(pose.y))}; }

  void emit(const Action& a, int n = 1) {
    for (int i = 0; i < n; ++i) {
      actions.push_back(a);
      pose = step(s_, m_, pose, a);
    }
  }
  void hold(int n) { emit(Action{}, n); }
  // Turns by delta degrees at `rate` per frame (last frame takes the remainder).
  void turn_by(double delta, double rate) {
    double sign = delta < 0 ? -1 : 1, left = std::fabs(delta);
    while (left > 0) {
      double d = std::min(rate, left);
      Action a;
      a.dyaw_deg = sign * d;
      emit(a);
      left -= d;
    }
  }
  void turn_to(double yaw, double rate) { turn_by(wrap_deg(yaw - pose.yaw_deg), rate); }
  // Walks a cell path (consecutive 4-neighbours, starting at the current cell) facing forward.
  void walk(const std::vector<Cell>& path, double rate) {
    const int per_cell = static_cast<int>(std::lround(1.0 / m_.speed));
    for (size_t i = 1; i < path.size();) {
      int d = dir_between(path[i - 1], path[i]);
      size_t j = i;
      while (j < path.size() && dir_between(path[j - 1], path[j]) == d) ++j;
      turn_to(dir_yaw(d), rate);
      Action a;
      a.forward = 1;
      emit(a, static_cast<int>(j - i) * per_cell);
      i = j;
    }
  }
  void mark_anchor() { anchors.push_back({frames(), pose}); }

  static int dir_between(Cell a, Cell b) {
    for (int d = 0; d < 4; ++d)
      if (a.first + kDir[d][0] == b.first && a.second + kDir[d][1] == b.second) return d;
    throw wm::Error("planner: path cells not adjacent");
  }

  // Cheapest path with few turns: Dijkstra over (cell, heading) with a turn penalty.
  std::vector<Cell> path_to(Cell goal) const {
    const int W = s_.width, H = s_.height;
    auto id = [&](int x, int y, int d) { return (static_cast<size_t>(y) * W + x) * 4 + d; };
    std::vector<int> dist(static_cast<size_t>(W) * H * 4, std::numeric_limits<int>::max());
    std::vector<int64_t> parent(dist.size(), -1);
    using Q = std::pair<int, size_t>;
    std::priority_queue<Q, std::vector<Q>, std::greater<Q>> q;
    Cell c = cell();
    for (int d = 0; d < 4; ++d) {
      dist[id(c.first, c.second, d)] = 0;
      q.push({0, id(c.first, c.second, d)});
    }
    size_t found = SIZE_MAX;
    while (!q.empty()) {
      auto [cost, u] = q.top();
      q.pop();
      if (cost != dist[u]) continue;
      int d = static_cast<int>(u % 4);
      int x = static_cast<int>((u / 4) % W), y = static_cast<int>((u / 4) / W);
      if (x == goal.first && y == goal.second) { found = u; break; }
      for (int nd = 0; nd < 4; ++nd) {
        int nx = x + kDir[nd][0], ny = y + kDir[nd][1];
        if (s_.is_solid(nx, ny)) continue;
        int turn = nd == d ? 0 : ((nd + 2) % 4 == d ? 4 : 2);
        size_t v = id(nx, ny, nd);
        if (cost + 1 + turn < dist[v]) {
          dist[v] = cost + 1 + turn;
          parent[v] = static_cast<int64_t>(u);
          q.push({dist[v], v});
        }
      }
    }
    std::vector<Cell> path;
    if (found == SIZE_MAX) return path;
    for (int64_t u = static_cast<int64_t>(found); u >= 0; u = parent[static_cast<size_t>(u)])
      path.push_back({static_cast<int>((u / 4) % W), static_cast<int>((u / 4) / W)});
    std::reverse(path.begin(), path.end());
    // The start appears once per heading state; keep one.
    while (path.size() >= 2 && path[0] == path[1]) path.erase(path.begin());
    return path;
  }

  // BFS distances (in cells) from the current cell.
  std::vector<int> distances() const {
    std::vector<int> dist(static_cast<size_t>(s_.width) * s_.height, -1);
    Cell c = cell();
    std::queue<Cell> q;
    q.push(c);
    dist[static_cast<size_t>(c.second) * s_.width + c.first] = 0;
    while (!q.empty()) {
      auto [x, y] = q.front();
      q.pop();
      for (auto& o : kDir) {
        int nx = x + o[0], ny = y + o[1];
        if (s_.is_solid(nx, ny)) continue;
        size_t i = static_cast<size_t>(ny) * s_.width + nx;
        if (dist[i] >= 0) continue;
        dist[i] = dist[static_cast<size_t>(y) * s_.width + x] + 1;
        q.push({nx, ny});
      }
    }
    return dist;
  }

  // A random cell at BFS distance in [lo, hi] (the farthest one if none).
  bool pick_target(int lo, int hi, Cell& out) {
    std::vector<int> dist = distances();
    std::vector<Cell> cand;
    int best = -1;
    Cell far{0, 0};
    for (int y = 0; y < s_.height; ++y)
      for (int x = 0; x < s_.width; ++x) {
        int d = dist[static_cast<size_t>(y) * s_.width + x];
        if (d > best) { best = d; far = {x, y}; }
        if (d >= lo && d <= hi) cand.push_back({x, y});
      }
    if (!cand.empty()) { out = cand[static_cast<size_t>(rng_.uniform_int(0, static_cast<int>(cand.size()) - 1))]; return true; }
    if (best <= 0) return false;
    out = far;
    return true;
  }

  // Straight free run length from the current cell in direction d.
  int free_run(int d) const {
    Cell c = cell();
    int n = 0;
    while (!s_.is_solid(c.first + kDir[d][0] * (n + 1), c.second + kDir[d][1] * (n + 1))) ++n;
    return n;
  }

  const Scene& s_;
  const MotionParams& m_;
  Rng& rng_;
};

struct Loop {
  int x0, y0, x1, y1;  // perimeter cells' bounding box
};

// Rectangular loops of free cells that enclose at least one wall cell.
std::vector<Loop> find_loops(const Scene& s, int max_side) {
  const int W = s.width, H = s.height;
  std::vector<int> P(static_cast<size_t>(W + 1) * (H + 1), 0);  // 2D prefix sum of solid
  auto at = [&](int x, int y) -> int& { return P[static_cast<size_t>(y) * (W + 1) + x]; };
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) at(x + 1, y + 1) = at(x, y + 1) + at(x + 1, y) - at(x, y) + s.is_solid(x, y);
  auto sum = [&](int x0, int y0, int x1, int y1) {  // inclusive
    return at(x1 + 1, y1 + 1) - at(x0, y1 + 1) - at(x1 + 1, y0) + at(x0, y0);
  };
  std::vector<Loop> out;
  for (int y0 = 1; y0 < H - 1; ++y0)
    for (int x0 = 1; x0 < W - 1; ++x0) {
      if (s.is_solid(x0, y0)) continue;
      for (int x1 = x0 + 2; x1 < W - 1 && x1 - x0 <= max_side; ++x1) {
        if (sum(x0, y0, x1, y0) != 0) break;  // top edge blocked: wider ones are too
        for (int y1 = y0 + 2; y1 < H - 1 && y1 - y0 <= max_side; ++y1) {
          if (sum(x0, y0, x0, y1) != 0) break;  // left edge blocked
          if (sum(x1, y0, x1, y1) != 0 || sum(x0, y1, x1, y1) != 0) continue;
          if (sum(x0 + 1, y0 + 1, x1 - 1, y1 - 1) == 0) continue;  // nothing to go round
          out.push_back({x0, y0, x1, y1});
        }
      }
    }
  return out;
}

// Closure kinds a plan draws from, with their weights.
struct ClosureKind {
  const char* name;
  double w;
};
const ClosureKind kClosureKinds[] = {{"yaw_sweep", 2},  {"spin", 1},        {"look_around", 1},
                                     {"repeat_sweep", 1}, {"out_and_back", 2}, {"step_back", 1},
                                     {"strafe_back", 1}, {"loop_block", 3},   {"return", 2}};

// Draws a closure kind by weight (one draw from rng).
std::string draw_closure_kind(Rng& rng) {
  double total_w = 0;
  for (const ClosureKind& k : kClosureKinds) total_w += k.w;
  double r = rng.uniform(0, total_w);
  std::string k = kClosureKinds[0].name;
  for (const ClosureKind& kk : kClosureKinds) {
    if (r < kk.w) { k = kk.name; break; }
    r -= kk.w;
  }
  return k;
}

// Turning speeds (degrees per frame) that plans draw from.
const double kRates[] = {5.0, 7.5, 10.0, 15.0};

// One plan: a random start, then segments appended one after another, each a loop closure or
// travel between them. Each segment method appends its actions and its Segment and returns
// true, or returns false, having appended nothing, when the scene has no room for it here.
class PlanBuilder {
 public:
  // Draws the start (a free cell's centre from `cells`, not empty, facing a multiple of 15
  // degrees) and the turning speed while walking.
  PlanBuilder(const Scene& scene, const std::vector<Cell>& cells, const MotionParams& motion, Rng& rng)
      : rng_(rng), pl_(scene, motion, rng), per_cell_(static_cast<int>(std::lround(1.0 / motion.speed))) {
    Cell c0 = cells[static_cast<size_t>(rng.uniform_int(0, static_cast<int>(cells.size()) - 1))];
    pl_.pose = Pose{c0.first + 0.5, c0.second + 0.5, wrap_deg(15.0 * rng.uniform_int(0, 23)), 0.0};
    start_ = pl_.pose;
    walk_rate_ = kRates[rng.uniform_int(1, 3)];
    loops_ = find_loops(scene, 8);
  }

  // Appends closures, with travel between them, until the plan holds `target` frames (or 200
  // rounds have passed).
  void extend_to(int target) {
    int guard = 0;
    bool first = true;
    while (pl_.frames() < target && ++guard < 200) {
      if (!first && rng_.chance(0.45)) travel(4, 14);
      first = false;
      if (!closure(draw_closure_kind(rng_))) {
        if (!travel(3, 10)) sweep("yaw_sweep");
      }
    }
  }

  // Stores the start, the first `target` actions and the segments cut to them in ep.
  void cut_into(int target, Episode& ep) {
    pl_.actions.resize(static_cast<size_t>(target));
    std::vector<Segment> segs;
    for (Segment s : pl_.segments) {
      if (s.start >= target) break;
      s.end = std::min(s.end, target);
      if (s.end > s.start) segs.push_back(s);
    }
    ep.start = start_;
    ep.actions = std::move(pl_.actions);
    ep.segments = std::move(segs);
  }

 private:
  bool closure(const std::string& k) {
    if (k == "yaw_sweep" || k == "spin" || k == "look_around" || k == "repeat_sweep") return sweep(k);
    if (k == "out_and_back") return out_and_back();
    if (k == "step_back") return straight_back(false);
    if (k == "strafe_back") return straight_back(true);
    if (k == "loop_block") return loop_block();
    return go_back();
  }

  void begin(const std::string& kind) { pl_.segments.push_back({kind, pl_.frames(), pl_.frames()}); }
  void end() { pl_.segments.back().end = pl_.frames(); }

  // Turning on the spot and back: yaw_sweep (away, hold, back), repeat_sweep (and again from
  // the other side), spin (a full turn), look_around (one side, the other, the middle).
  bool sweep(const std::string& kind) {
    double rate = kRates[rng_.uniform_int(0, 2)];
    begin(kind);
    pl_.mark_anchor();
    if (kind == "spin") {
      pl_.turn_by(rng_.chance(0.5) ? 360.0 : -360.0, rate);
    } else if (kind == "look_around") {
      double a = 45.0 * rng_.uniform_int(2, 3), s = rng_.chance(0.5) ? 1 : -1;
      pl_.turn_by(s * a, rate);
      pl_.hold(rng_.uniform_int(0, 6));
      pl_.turn_by(-2 * s * a, rate);
      pl_.hold(rng_.uniform_int(0, 6));
      pl_.turn_by(s * a, rate);
    } else {
      const double angles[] = {90, 120, 135, 150, 180};
      double a = angles[rng_.uniform_int(0, 4)] * (rng_.chance(0.5) ? 1 : -1);
      int turn_frames = 2 * static_cast<int>(std::ceil(std::fabs(a) / rate));
      pl_.turn_by(a, rate);
      pl_.hold(std::max(0, 50 - turn_frames) + rng_.uniform_int(0, 10));
      pl_.turn_by(-a, rate);
      if (kind == "repeat_sweep") {  // come back to the same view again, from the other side
        pl_.hold(rng_.uniform_int(2, 8));
        pl_.turn_by(-a, rate);
        pl_.hold(std::max(0, 50 - turn_frames) + rng_.uniform_int(0, 10));
        pl_.turn_by(a, rate);
      }
    }
    end();
    return true;
  }

  // A walk to a random cell [lo, hi] cells away, maybe looking somewhere at the end.
  bool travel(int lo, int hi) {
    Cell t;
    if (!pl_.pick_target(lo, hi, t)) return false;
    auto path = pl_.path_to(t);
    if (path.size() < 2) return false;
    begin("travel");
    pl_.walk(path, walk_rate_);
    if (rng_.chance(0.5)) pl_.turn_by(90.0 * rng_.uniform_int(-1, 1), walk_rate_);  // look somewhere
    end();
    return true;
  }

  // A walk to a cell 3 to 8 cells away and back the same way, facing as at the start.
  bool out_and_back() {
    Cell t;
    if (!pl_.pick_target(3, 8, t)) return false;
    auto path = pl_.path_to(t);
    if (path.size() < 4) return false;
    begin("out_and_back");
    pl_.mark_anchor();
    Pose start = pl_.pose;
    pl_.walk(path, walk_rate_);
    if (rng_.chance(0.4)) pl_.turn_by(rng_.chance(0.5) ? 90 : -90, walk_rate_);
    std::reverse(path.begin(), path.end());
    pl_.walk(path, walk_rate_);
    pl_.turn_to(start.yaw_deg, walk_rate_);
    end();
    return true;
  }

  // step_back / strafe_back: face an axis first, then move k cells (forward or sideways) and
  // come back without turning.
  bool straight_back(bool strafe) {
    int d0 = rng_.uniform_int(0, 3);
    for (int k = 0; k < 4; ++k) {
      int face = (d0 + k) % 4;
      int move = strafe ? (face + 1) % 4 : face;  // strafe right = heading + 90
      int sign = 1;
      int run = pl_.free_run(move);
      if (strafe && run < 3) { move = (face + 3) % 4; sign = -1; run = pl_.free_run(move); }
      if (run < 3) continue;
      int n = rng_.uniform_int(3, std::min(run, 7));
      pl_.turn_to(dir_yaw(face), walk_rate_);
      begin(strafe ? "strafe_back" : "step_back");
      pl_.mark_anchor();
      Action out, back;
      if (strafe) { out.strafe = sign; back.strafe = -sign; } else { out.forward = 1; back.forward = -1; }
      pl_.emit(out, n * per_cell_);
      pl_.hold(rng_.uniform_int(0, 4));
      pl_.emit(back, n * per_cell_);
      end();
      return true;
    }
    return false;
  }

  // One or two laps round a block (a random loop of find_loops), from a random corner, after
  // walking there.
  bool loop_block() {
    if (loops_.empty()) return false;
    const Loop& L = loops_[static_cast<size_t>(rng_.uniform_int(0, static_cast<int>(loops_.size()) - 1))];
    Cell corners[4] = {{L.x0, L.y0}, {L.x1, L.y0}, {L.x1, L.y1}, {L.x0, L.y1}};
    int k = rng_.uniform_int(0, 3);
    bool cw = rng_.chance(0.5);  // clockwise on screen (y down): x0y0 -> x1y0 -> x1y1 -> x0y1
    auto go = pl_.path_to(corners[k]);
    if (go.empty()) return false;
    if (go.size() >= 2) {
      begin("travel");
      pl_.walk(go, walk_rate_);
      end();
    }
    const std::vector<Cell> lap = lap_cells(corners, k, cw);
    int first_dir = Planner::dir_between(lap[0], lap[1]);
    pl_.turn_to(dir_yaw(first_dir), walk_rate_);
    begin("loop_block");
    pl_.mark_anchor();
    int laps = rng_.chance(0.3) ? 2 : 1;
    for (int l = 0; l < laps; ++l) {
      pl_.walk(lap, walk_rate_);
      pl_.turn_to(dir_yaw(first_dir), walk_rate_);
    }
    end();
    return true;
  }

  // Perimeter cells of the loop with these corners, in lap order from corner k.
  static std::vector<Cell> lap_cells(const Cell (&corners)[4], int k, bool cw) {
    std::vector<Cell> lap{corners[k]};
    for (int e = 0; e < 4; ++e) {
      int a = cw ? (k + e) % 4 : (k - e + 4) % 4, b = cw ? (k + e + 1) % 4 : (k - e + 3) % 4;
      Cell from = corners[a], to = corners[b];
      int sx = (to.first > from.first) - (to.first < from.first), sy = (to.second > from.second) - (to.second < from.second);
      for (Cell c = from; c != to;) {
        c = {c.first + sx, c.second + sy};
        lap.push_back(c);
      }
    }
    return lap;
  }

  // "return": a walk back to an anchor at least 64 frames old and 2 cells away, facing as then.
  bool go_back() {
    std::vector<Planner::Anchor> old;
    for (const auto& a : pl_.anchors)
      if (pl_.frames() - a.frame >= 64 && position_distance(a.pose, pl_.pose) >= 2.0) old.push_back(a);
    if (old.empty()) return false;
    const auto& a = old[static_cast<size_t>(rng_.uniform_int(0, static_cast<int>(old.size()) - 1))];
    Cell goal{static_cast<int>(std::floor(a.pose.x)), static_cast<int>(std::floor(a.pose.y))};
    auto path = pl_.path_to(goal);
    if (path.size() < 2) return false;
    begin("return");
    pl_.walk(path, walk_rate_);
    pl_.turn_to(a.pose.yaw_deg, walk_rate_);
    pl_.hold(rng_.uniform_int(0, 8));
    end();
    return true;
  }

  Rng& rng_;
  Planner pl_;
  const int per_cell_;
  Pose start_;
  double walk_rate_ = 0;
  std::vector<Loop> loops_;
};

// Builds one plan of about `target` frames into ep: its start, actions and segments. cells: the
// scene's free cells, not empty.
void plan(const Scene& scene, const std::vector<Cell>& cells, const MotionParams& motion, Rng& rng, int target,
          Episode& ep) {
  PlanBuilder b(scene, cells, motion, rng);
  b.extend_to(target);
  b.cut_into(target, ep);
}

// An episode in `scene` (options valid), or nullopt with *why set when there is none: the scene
// has no free cell, or none of options.max_attempts plans has a revisit.
std::optional<Episode> try_generate_episode(const Scene& scene, uint64_t seed, const TrajectoryOptions& options,
                                            std::string* why) {
  Rng rng(hash_combine(seed, 0x9A7));
  const std::vector<Cell> cells = scene.free_cells();
  if (cells.empty()) {
    *why = "scene has no free cell";
    return std::nullopt;
  }
  for (int attempt = 0; attempt < options.max_attempts; ++attempt) {
    Episode ep;
    ep.world = scene.params;
    int target = options.fps * rng.uniform_int(options.min_seconds, options.max_seconds);
    plan(scene, cells, ep.motion, rng, target, ep);
    derive_poses(ep, scene);
    ep.revisits = detect_revisits(ep.poses, options.criteria);
    if (options.verify_psnr && !ep.revisits.empty()) {
      std::vector<double> psnr = revisit_psnrs(ep, scene, options.render);
      std::vector<RevisitPair> kept;
      for (size_t i = 0; i < psnr.size(); ++i)
        if (psnr[i] >= options.min_psnr_db) kept.push_back(ep.revisits[i]);
      ep.revisits = std::move(kept);
    }
    if (!ep.revisits.empty()) return ep;
  }
  *why = "no trajectory with a revisit after " + std::to_string(options.max_attempts) + " attempts in scene seed " +
         std::to_string(scene.params.seed);
  return std::nullopt;
}

}  // namespace

Episode generate_episode(uint64_t seed, const TrajectoryOptions& options) {
  validate(options);
  Rng rng(hash_combine(seed, 0x7A7));
  // Try a few scenes: a scene might be too cramped for any loop closure of the drawn kinds.
  std::string why;
  for (int s = 0; s < 4; ++s) {
    Scene scene = generate_scene(random_world_params(s == 0 ? seed : json_safe_seed(hash_combine(seed, 1000 + s))));
    if (std::optional<Episode> ep = try_generate_episode(scene, rng.fork(), options, &why)) return std::move(*ep);
  }
  throw wm::Error("generate_episode(seed " + std::to_string(seed) + "): " + why);
}

Episode generate_episode(const Scene& scene, uint64_t seed, const TrajectoryOptions& options) {
  validate(options);
  std::string why;
  if (std::optional<Episode> ep = try_generate_episode(scene, seed, options, &why)) return std::move(*ep);
  throw wm::Error(why);
}

}  // namespace wm::world
