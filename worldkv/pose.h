#pragma once
// The camera pose, the one pose type of the library: the session takes one per frame, the DiT
// is conditioned on it (worldkv/conditioning.h) and the memory retrieves chunks by it. A
// position and a rotation (yaw about the vertical axis, then pitch), angles in radians. The
// model's convention: x and y horizontal in the units of the world it was trained on (the tiny
// model: cells of the procedural world, whose y grows southward), z vertical (0 there); yaw 0
// faces +x and +pi/2 faces +y (there, a turn to the right); pitch > 0 looks up.
// A chunk's pose is the mean of its frames' poses: mean position, and the chordal mean rotation
// (the rotation nearest to the mean of the rotation matrices).
#include <array>
#include <vector>

namespace wm::worldkv {

struct Pose {
  double x = 0, y = 0, z = 0;  // position
  double yaw = 0;              // radians, about the vertical axis (+ turns right, towards +y)
  double pitch = 0;            // radians, about the camera's horizontal axis (+ looks up)
};

using Rotation = std::array<double, 9>;  // row-major 3x3
using Matrix4 = std::array<double, 16>;  // row-major 4x4

// Degrees to radians and back, for the edges that speak degrees (the DiT's inputs, a test world).
// degrees(radians(d)) is d or a neighbouring double; for the angles a camera turns by (the test
// world's multiples of 2^-k degrees) both round to the same float32, the DiT's input type, so a
// pose that went through radians reaches the model unchanged (tests/worldkv/test_session.cpp).
constexpr double kRadiansPerDegree = 3.14159265358979323846 / 180.0;
inline double radians(double degrees) { return degrees * kRadiansPerDegree; }
inline double degrees(double radians) { return radians / kRadiansPerDegree; }

// The rotation matrix of a pose's yaw and pitch.
Rotation rotation_of(const Pose& p);
// Geodesic angle between two rotations, in [0, pi].
double geodesic_angle(const Rotation& a, const Rotation& b);
double geodesic_angle(const Pose& a, const Pose& b);
// Mean of the frames' poses (see above). Throws wm::Error for an empty list.
Pose mean_pose(const std::vector<Pose>& frames);
// The camera-to-world matrix of a pose in OpenCV axes (camera x right, y down, z forward; world
// axes W = (our y, -our z, our x), so Pose{} is the identity): what LingBot-World's camera input
// takes. The rotation is proper (det +1): W is right-handed as the physical directions (right,
// down, forward) are.
Matrix4 opencv_camera_to_world(const Pose& p);
// Back: the position, and the yaw and pitch of the camera's forward axis (roll is dropped, which
// only a camera that rolls has). Pose -> matrix -> pose returns the pose (pitch within +-pi/2).
Pose pose_from_opencv(const Matrix4& c2w);

// Pose as a flat vector (x, y, z, yaw, pitch) for block metadata, and back.
std::vector<double> to_vector(const Pose& p);
Pose from_vector(const std::vector<double>& v);

}  // namespace wm::worldkv
