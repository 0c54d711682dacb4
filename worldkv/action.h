#pragma once
// One frame's control input, in the model's terms: the movement keys held and the turn of the
// camera. The DiT is conditioned on it (worldkv/conditioning.h: W, S, A, D and the yaw turned);
// action t is what moved the camera into frame t, as the pose of frame t records.
// Matrix-Game-2.0 reads its keyboard and mouse as they are instead (Mg2Input).
#include <vector>

namespace wm::worldkv {

struct Action {
  int forward = 0;  // +1 forward (W), -1 back (S), 0 neither
  int strafe = 0;   // +1 right (D), -1 left (A), 0 neither
  double yaw = 0;   // radians turned this frame, + to the right (the Pose convention)
};

// One video frame's control input, in Matrix-Game-2.0's terms.
struct Mg2Input {
  std::vector<float> keyboard;  // keyboard_dim values (universal: W S A D; gta_drive: W S;
                                // templerun: one-hot of 7)
  float pitch = 0;              // mouse, + looks up (upstream demos: +-0.1 a frame)
  float yaw = 0;                // mouse, + turns right
};

}  // namespace wm::worldkv
