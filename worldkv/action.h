#pragma once
// One frame's control input, in the model's terms: the movement keys held and the turn of the
// camera. The DiT is conditioned on it (worldkv/conditioning.h: W, S, A, D and the yaw turned);
// action t is what moved the camera into frame t, as the pose of frame t records.
namespace wm::worldkv {

struct Action {
  int forward = 0;  // +1 forward (W), -1 back (S), 0 neither
  int strafe = 0;   // +1 right (D), -1 left (A), 0 neither
  double yaw = 0;   // radians turned this frame, + to the right (the Pose convention)
};

}  // namespace wm::worldkv
