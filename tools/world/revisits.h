#pragma once
// Loop closures in a trajectory: frame j "revisits" frame i when the camera comes back to i's pose
// (within tolerance) at least min_gap_frames later, after having looked or walked away in between.
#include <vector>

#include "tools/world/pose.h"

namespace wm::world {

// Part of the suite format: what counts as a revisit.
struct RevisitCriteria {
  double pos_tol = 0.02;        // max position difference, cells
  double yaw_tol_deg = 0.5;     // max yaw difference, degrees
  double pitch_tol_deg = 0.5;   // max pitch difference, degrees
  int min_gap_frames = 48;      // j - i >= this (3 s at 16 fps)
  double away_dist = 1.5;       // "walked away": some frame in between is this far from pose i (cells) ...
  double away_yaw_deg = 90.0;   // ... or "looked away": its yaw differs from pose i's by at least this
};

// Validates; throws wm::Error naming the field, expected and got.
void validate(const RevisitCriteria& c);

// One loop closure: frame `revisit` shows again the view of the earlier frame `first`.
struct RevisitPair {
  int first = 0;
  int revisit = 0;
  bool operator==(const RevisitPair& o) const { return first == o.first && revisit == o.revisit; }
};

// True when poses a and b match within the tolerances of c.
bool poses_match(const Pose& a, const Pose& b, const RevisitCriteria& c);

// All revisits in a pose sequence: for each frame j, the earliest frame i that j revisits (if any),
// sorted by j. O(N^2).
std::vector<RevisitPair> detect_revisits(const std::vector<Pose>& poses, const RevisitCriteria& c);

// Whether (i, j) satisfies the criteria for these poses (gap, match, away in between); pairs out
// of range are false.
bool is_revisit(const std::vector<Pose>& poses, const RevisitPair& pair, const RevisitCriteria& c);

}  // namespace wm::world
