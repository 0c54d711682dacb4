#pragma once
// From the session's camera poses and actions to the DiT's per-frame conditioning tensors
// (dit/conditioning.h): the model was trained on [x, y, yaw in degrees] per frame and on
// W, S, A, D with the yaw turned in degrees, so this is the one place where radians become the
// model's degrees.
#include <ATen/ATen.h>

#include <vector>

#include "dit/conditioning.h"
#include "dit/config.h"
#include "worldkv/action.h"
#include "worldkv/pose.h"

namespace wm::worldkv {

// poses (F) -> [F, 3] float32 on the CPU: x, y, yaw in degrees (z and pitch are not model inputs).
at::Tensor pose_tensor(const std::vector<Pose>& poses);
// actions (F) -> [F, 5] float32 on the CPU: W, S, A, D as 0/1 and the yaw turned in degrees (the
// DiT's default action_dim 5). Throws wm::Error if action_dim is not 5.
at::Tensor action_tensor(const std::vector<Action>& actions, int action_dim = 5);
// Both, on `device`: the conditioning of F frames for a model with conditioning config c.
// Throws wm::Error if the lists differ in length or action_tensor does.
dit::FrameCond frame_cond(const std::vector<Pose>& poses, const std::vector<Action>& actions,
                          const dit::CondConfig& c, at::Device device);

}  // namespace wm::worldkv
