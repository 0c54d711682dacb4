#include "tools/world/revisits.h"

#include <cmath>
#include <string>

#include "runtime/error.h"

namespace wm::world {

void validate(const RevisitCriteria& c) {
  auto bad = [](const std::string& field, const std::string& expected, double got) {
    throw wm::Error("RevisitCriteria." + field + ": expected " + expected + ", got " + std::to_string(got));
  };
  if (!(c.pos_tol >= 0 && c.pos_tol < 1)) bad("pos_tol", "[0, 1) cells", c.pos_tol);
  if (!(c.yaw_tol_deg >= 0 && c.yaw_tol_deg < 45)) bad("yaw_tol_deg", "[0, 45)", c.yaw_tol_deg);
  if (!(c.pitch_tol_deg >= 0 && c.pitch_tol_deg < 45)) bad("pitch_tol_deg", "[0, 45)", c.pitch_tol_deg);
  if (c.min_gap_frames < 1) bad("min_gap_frames", ">= 1", c.min_gap_frames);
  if (!(c.away_dist > c.pos_tol)) bad("away_dist", "> pos_tol", c.away_dist);
  if (!(c.away_yaw_deg > c.yaw_tol_deg && c.away_yaw_deg <= 180)) bad("away_yaw_deg", "(yaw_tol_deg, 180]", c.away_yaw_deg);
}

bool poses_match(const Pose& a, const Pose& b, const RevisitCriteria& c) {
  return std::fabs(a.x - b.x) <= c.pos_tol && std::fabs(a.y - b.y) <= c.pos_tol && position_distance(a, b) <= c.pos_tol &&
         yaw_diff_deg(a.yaw_deg, b.yaw_deg) <= c.yaw_tol_deg && std::fabs(a.pitch_deg - b.pitch_deg) <= c.pitch_tol_deg;
}

namespace {
bool is_away(const Pose& ref, const Pose& p, const RevisitCriteria& c) {
  return position_distance(ref, p) >= c.away_dist || yaw_diff_deg(ref.yaw_deg, p.yaw_deg) >= c.away_yaw_deg;
}
}  // namespace

std::vector<RevisitPair> detect_revisits(const std::vector<Pose>& poses, const RevisitCriteria& c) {
  const int n = static_cast<int>(poses.size());
  std::vector<int> first(n, -1);
  for (int i = 0; i < n; ++i) {
    bool away = false;
    for (int j = i + 1; j < n; ++j) {
      if (!away) {
        away = is_away(poses[i], poses[j], c);
        if (!away) continue;
      }
      if (j - i >= c.min_gap_frames && first[j] < 0 && poses_match(poses[i], poses[j], c)) first[j] = i;
    }
  }
  std::vector<RevisitPair> out;
  for (int j = 0; j < n; ++j)
    if (first[j] >= 0) out.push_back({first[j], j});
  return out;
}

bool is_revisit(const std::vector<Pose>& poses, const RevisitPair& pr, const RevisitCriteria& c) {
  const int n = static_cast<int>(poses.size());
  if (pr.first < 0 || pr.revisit >= n || pr.revisit - pr.first < c.min_gap_frames) return false;
  if (!poses_match(poses[pr.first], poses[pr.revisit], c)) return false;
  for (int k = pr.first + 1; k < pr.revisit; ++k)
    if (is_away(poses[pr.first], poses[k], c)) return true;
  return false;
}

}  // namespace wm::world
