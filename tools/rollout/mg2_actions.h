#pragma once
// Matrix-Game-2.0 control inputs for the programs: an actions file (one line per video frame)
// and generated trajectories, converted to the session's Mg2Input at this edge.
//
// Actions file: '#' starts a comment; blank lines are skipped; each other line is
//   KEYS [PITCH YAW]
// KEYS: universal: any of W S A D (e.g. "WA"), or "-" for none; gta_drive: W S, and A/D steer
// (yaw -0.1 / +0.1, as upstream's gta demos do, unless YAW is given); templerun: one of nomove,
// jump, slide, turnleft, turnright, leftside, rightside. PITCH and YAW: the mouse this frame
// (upstream demos use +-0.1); not allowed for templerun, which has no mouse.
#include <string>
#include <vector>

#include "worldkv/action.h"

namespace wm::rollout {

// Parses an actions file for a model of `mode` ("universal", "gta_drive", "templerun"). Throws
// wm::Error naming the file and line for anything it cannot read.
std::vector<worldkv::Mg2Input> load_mg2_actions(const std::string& path, const std::string& mode);
// One line's input (see above); `where` prefixes errors.
worldkv::Mg2Input parse_mg2_action(const std::string& line, const std::string& mode, const std::string& where);

// Generated trajectories of n video frames:
//   revisit  forward, a turn right, forward, then the same turns back (returns to earlier views)
//   forward  W held, the mouse still
//   orbit    W held, turning right at 0.1 a frame
//   random   keys and mouse drawn per 12-frame chunk from `seed`
// Throws wm::Error listing the names for an unknown one.
std::vector<worldkv::Mg2Input> mg2_trajectory(const std::string& name, int n, const std::string& mode,
                                              uint64_t seed = 0);
std::vector<std::string> mg2_trajectory_names();

}  // namespace wm::rollout
