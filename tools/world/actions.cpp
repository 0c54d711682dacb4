#include "tools/world/actions.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace wm::world {

std::string keys_of(const Action& a) {
  std::string k;
  if (a.forward > 0) k += 'W';
  if (a.forward < 0) k += 'S';
  if (a.strafe < 0) k += 'A';
  if (a.strafe > 0) k += 'D';
  return k;
}

void parse_keys(const std::string& keys, Action& out) {
  Action a = out;
  a.forward = 0;
  a.strafe = 0;
  bool seen[4] = {false, false, false, false};
  for (char c : keys) {
    int i;
    switch (c) {
      case 'W': case 'w': i = 0; a.forward += 1; break;
      case 'S': case 's': i = 1; a.forward -= 1; break;
      case 'A': case 'a': i = 2; a.strafe -= 1; break;
      case 'D': case 'd': i = 3; a.strafe += 1; break;
      default:
        throw wm::Error("keys \"" + keys + "\": expected letters from W A S D, got '" + std::string(1, c) + "'");
    }
    if (seen[i]) throw wm::Error("keys \"" + keys + "\": letter '" + std::string(1, c) + "' repeated");
    seen[i] = true;
  }
  if ((seen[0] && seen[1]) || (seen[2] && seen[3]))
    throw wm::Error("keys \"" + keys + "\": opposite keys (W+S or A+D) held together");
  out = a;
}

void validate(const MotionParams& m) {
  auto bad = [](const std::string& field, const std::string& expected, double got) {
    throw wm::Error("MotionParams." + field + ": expected " + expected + ", got " + std::to_string(got));
  };
  if (!(m.speed > 0 && m.speed <= 1)) bad("speed", "(0, 1] cells per frame", m.speed);
  if (!(m.radius >= 0 && m.radius < 0.5)) bad("radius", "[0, 0.5) cells", m.radius);
  if (!(m.max_pitch_deg >= 0 && m.max_pitch_deg < 90)) bad("max_pitch_deg", "[0, 90)", m.max_pitch_deg);
}

namespace {

// Resolves a move along one axis from `from` by `delta` (other coordinate `other`, fixed).
// Returns the new coordinate; sets blocked when a wall stopped it.
double move_axis(const Scene& s, double r, double from, double delta, double other, bool along_x, bool& blocked) {
  double to = from + delta;
  if (delta == 0) return from;
  // Cells the camera's square footprint [other - r, other + r] spans on the other axis.
  int o0 = static_cast<int>(std::floor(other - r)), o1 = static_cast<int>(std::ceil(other + r)) - 1;
  auto solid = [&](int c, int o) { return along_x ? s.is_solid(c, o) : s.is_solid(o, c); };
  if (delta > 0) {
    // Last column the leading edge overlaps now and after the move (an edge exactly on a cell
    // boundary does not overlap the cell beyond it).
    int c0 = static_cast<int>(std::ceil(from + r)) - 1, c1 = static_cast<int>(std::ceil(to + r)) - 1;
    for (int c = c0 + 1; c <= c1; ++c)
      for (int o = o0; o <= o1; ++o)
        if (solid(c, o)) { blocked = true; return std::max(from, c - r); }
  } else {
    int c0 = static_cast<int>(std::floor(from - r)), c1 = static_cast<int>(std::floor(to - r));
    for (int c = c0 - 1; c >= c1; --c)
      for (int o = o0; o <= o1; ++o)
        if (solid(c, o)) { blocked = true; return std::min(from, c + 1 + r); }
  }
  return to;
}

}  // namespace

Pose step(const Scene& scene, const MotionParams& m, const Pose& p, const Action& a, bool* blocked) {
  Pose q = p;
  q.yaw_deg = wrap_deg(p.yaw_deg + a.dyaw_deg);
  q.pitch_deg = std::clamp(p.pitch_deg + a.dpitch_deg, -m.max_pitch_deg, m.max_pitch_deg);
  bool hit = false;
  if (a.forward != 0 || a.strafe != 0) {
    double hx, hy;
    heading(q.yaw_deg, hx, hy);
    double f = std::clamp(a.forward, -1, 1), s = std::clamp(a.strafe, -1, 1);
    double mx = f * hx + s * -hy, my = f * hy + s * hx;  // right vector = (-hy, hx)
    double norm = (f != 0 && s != 0) ? m.speed / std::sqrt(2.0) : m.speed;
    mx *= norm;
    my *= norm;
    q.x = move_axis(scene, m.radius, p.x, mx, p.y, true, hit);
    q.y = move_axis(scene, m.radius, p.y, my, q.x, false, hit);
  }
  if (blocked) *blocked = hit;
  return q;
}

std::vector<Pose> integrate(const Scene& scene, const MotionParams& m, const Pose& start,
                            const std::vector<Action>& actions, int* blocked_frames) {
  validate(m);
  std::vector<Pose> poses;
  poses.reserve(actions.size());
  Pose p = start;
  int blocked = 0;
  for (const Action& a : actions) {
    bool b = false;
    p = step(scene, m, p, a, &b);
    blocked += b;
    poses.push_back(p);
  }
  if (blocked_frames) *blocked_frames = blocked;
  return poses;
}

std::vector<ActionRun> encode_runs(const std::vector<Action>& actions) {
  std::vector<ActionRun> runs;
  for (const Action& a : actions) {
    if (!runs.empty() && runs.back().action == a) ++runs.back().count;
    else runs.push_back({1, a});
  }
  return runs;
}

std::vector<Action> decode_runs(const std::vector<ActionRun>& runs) {
  std::vector<Action> out;
  for (const ActionRun& r : runs) out.insert(out.end(), static_cast<size_t>(std::max(0, r.count)), r.action);
  return out;
}

}  // namespace wm::world
