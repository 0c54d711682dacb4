#pragma once
// Camera poses for retrieval: a position and a rotation (yaw about the vertical axis, then
// pitch). A chunk's pose is the mean of its frames' poses: mean position, and the chordal mean
// rotation (the rotation nearest to the mean of the rotation matrices).
#include <array>
#include <vector>

namespace wm::worldkv {

struct Pose {
  double x = 0, y = 0, z = 0;  // position
  double yaw = 0;              // radians, about the vertical axis
  double pitch = 0;            // radians, about the camera's horizontal axis
};

using Rotation = std::array<double, 9>;  // row-major 3x3

// The rotation matrix of a pose's yaw and pitch.
Rotation rotation_of(const Pose& p);
// Geodesic angle between two rotations, in [0, pi].
double geodesic_angle(const Rotation& a, const Rotation& b);
double geodesic_angle(const Pose& a, const Pose& b);
// Mean of the frames' poses (see above). Throws wm::Error for an empty list.
Pose mean_pose(const std::vector<Pose>& frames);
// Pose as a flat vector (x, y, z, yaw, pitch) for block metadata, and back.
std::vector<double> to_vector(const Pose& p);
Pose from_vector(const std::vector<double>& v);

}  // namespace wm::worldkv
