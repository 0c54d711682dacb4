#pragma once
// Camera pose in the grid world: position in map cells, yaw (and optional pitch) in degrees.
//
// Coordinates: x grows to the east (map column), y grows to the south (map row); a cell (cx, cy)
// spans [cx, cx+1) x [cy, cy+1). yaw = 0 faces +x, yaw = 90 faces +y (a turn to the right, as a
// mouse moved right). Yaw is kept in degrees so that turns by dyadic steps (7.5, 2.5, 0.5 ...)
// add up exactly and a camera that turns back lands on exactly the same pose.
#include <cmath>
#include <string>

namespace wm::world {

struct Pose {
  double x = 0.0;          // cells, east
  double y = 0.0;          // cells, south
  double yaw_deg = 0.0;    // heading, degrees, wrapped to [-180, 180)
  double pitch_deg = 0.0;  // look up (+) / down (-), degrees; rendered as a horizon shift

  double yaw_rad() const { return yaw_deg * (M_PI / 180.0); }
};

// Wraps an angle in degrees to [-180, 180).
inline double wrap_deg(double a) {
  if (a >= -180.0 && a < 180.0) return a;
  a = std::fmod(a + 180.0, 360.0);
  if (a < 0) a += 360.0;
  return a - 180.0;
}

// Absolute smallest difference between two headings in degrees, in [0, 180].
inline double yaw_diff_deg(double a, double b) { return std::fabs(wrap_deg(a - b)); }

// Euclidean distance between two pose positions, in cells.
inline double position_distance(const Pose& a, const Pose& b) { return std::hypot(a.x - b.x, a.y - b.y); }

// Unit heading vector for a yaw in degrees; exact (0, +-1) values at multiples of 90 degrees so
// that axis-aligned walks add up exactly.
inline void heading(double yaw_deg, double& dx, double& dy) {
  double w = wrap_deg(yaw_deg);
  if (w == 0.0) { dx = 1; dy = 0; return; }
  if (w == 90.0) { dx = 0; dy = 1; return; }
  if (w == -180.0) { dx = -1; dy = 0; return; }
  if (w == -90.0) { dx = 0; dy = -1; return; }
  double r = w * (M_PI / 180.0);
  dx = std::cos(r);
  dy = std::sin(r);
}

// "x=.. y=.. yaw=.." for messages.
inline std::string to_string(const Pose& p) {
  return "(x=" + std::to_string(p.x) + ", y=" + std::to_string(p.y) + ", yaw=" + std::to_string(p.yaw_deg) +
         (p.pitch_deg != 0 ? ", pitch=" + std::to_string(p.pitch_deg) : std::string()) + ")";
}

}  // namespace wm::world
