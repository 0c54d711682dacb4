#pragma once
// From the procedural world's poses and actions to what the model and the memory take.
#include <ATen/ATen.h>

#include <vector>

#include "dit/config.h"
#include "dit/sampler.h"
#include "tools/world/actions.h"
#include "tools/world/raycaster.h"
#include "tools/world/pose.h"
#include "worldkv/pose.h"

namespace wm::rollout {

// Poses [F, 3] float32: x, y, yaw_deg (the DiT's per-frame pose).
at::Tensor pose_tensor(const std::vector<world::Pose>& poses);
// Actions [F, 5] float32: W, S, A, D as 0/1 and the yaw delta in degrees (the DiT's default
// action_dim 5). Throws wm::Error if action_dim is not 5.
at::Tensor action_tensor(const std::vector<world::Action>& actions, int action_dim = 5);
// The memory's pose (radians, z = 0) of a world pose.
worldkv::Pose memory_pose(const world::Pose& p);
std::vector<worldkv::Pose> memory_poses(const std::vector<world::Pose>& p);

// The ground-truth render settings that match a model: its frame size and field of view.
world::RenderSpec render_spec_of(const dit::DitConfig& c);
// A sampler of n evenly spaced steps: t = 1, 1 - 1/n, ..., 1/n.
dit::SamplerConfig sampler_with_steps(int n);

}  // namespace wm::rollout
