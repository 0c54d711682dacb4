#pragma once
// Per-frame actions (W/A/S/D keys and a mouse yaw/pitch delta) and the deterministic integrator
// that turns them into one camera pose per frame, with collision against the scene's walls.
//
// Convention: a trajectory of N frames has N actions; pose[t] = step(pose[t-1], action[t]) with
// pose[-1] = the start pose. So action t is what moved the camera into frame t.
#include <string>
#include <vector>

#include "tools/world/pose.h"
#include "tools/world/scene.h"

namespace wm::world {

struct Action {
  int forward = 0;          // +1 W (forward), -1 S (back), 0 none
  int strafe = 0;           // +1 D (right), -1 A (left), 0 none
  double dyaw_deg = 0.0;    // mouse yaw delta this frame, degrees, + = turn right
  double dpitch_deg = 0.0;  // mouse pitch delta this frame, degrees, + = look up

  bool operator==(const Action& o) const {
    return forward == o.forward && strafe == o.strafe && dyaw_deg == o.dyaw_deg && dpitch_deg == o.dpitch_deg;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// Key letters held in an action: "", "W", "WD", "SA", ... (W/S first, then A/D).
std::string keys_of(const Action& a);
// Parses key letters (any order, each of W A S D at most once, W+S or A+D together not allowed);
// throws wm::Error with the offending text (leaving `a` unchanged).
void parse_keys(const std::string& keys, Action& a);

struct MotionParams {
  double speed = 0.125;     // cells per frame when W/S/A/D is held (2 cells/s at 16 fps)
  double radius = 0.2;      // collision radius of the camera, cells (< 0.5)
  double max_pitch_deg = 60.0;
};

// Validates; throws wm::Error naming the field, expected and got.
void validate(const MotionParams& m);

// One frame: turn by the mouse deltas, then move along the new heading (forward + strafe, diagonal
// normalised), sliding along walls: x then y are resolved separately, and a move that would bring
// the camera closer than `radius` to a wall cell stops at that distance. `blocked` (optional) is
// set when a wall cut the move short.
Pose step(const Scene& scene, const MotionParams& m, const Pose& p, const Action& a, bool* blocked = nullptr);

// Poses for all frames: pose[t] = step(pose[t-1], actions[t]), pose[-1] = start.
std::vector<Pose> integrate(const Scene& scene, const MotionParams& m, const Pose& start,
                            const std::vector<Action>& actions, int* blocked_frames = nullptr);

// A run of identical actions, the compact storage unit: [count, "keys", dyaw_deg(, dpitch_deg)].
struct ActionRun {
  int count = 0;
  Action action;
};

// Run-length encoding of an action list (adjacent equal actions merged).
std::vector<ActionRun> encode_runs(const std::vector<Action>& actions);
// Expands runs back to per-frame actions.
std::vector<Action> decode_runs(const std::vector<ActionRun>& runs);

}  // namespace wm::world
