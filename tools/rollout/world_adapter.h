#pragma once
// The procedural world at the session's edge: its poses (degrees, tools/world/pose.h) and
// actions become the model's (worldkv::Pose in radians, worldkv::Action), and its renders take
// the model's frame size and field of view. Nothing else converts the world's types.
#include <vector>

#include "dit/config.h"
#include "tools/world/actions.h"
#include "tools/world/pose.h"
#include "tools/world/raycaster.h"
#include "worldkv/action.h"
#include "worldkv/model_adapter.h"
#include "worldkv/pose.h"

namespace wm::rollout {

// The model's pose of a world pose: x, y as they are, z = 0, yaw and pitch in radians.
worldkv::Pose model_pose(const world::Pose& p);
// And back (the viewer's ground truth at a pose the model was given): yaw and pitch in degrees
// again, each the world's or a neighbouring double (worldkv/pose.h).
world::Pose world_pose(const worldkv::Pose& p);
std::vector<worldkv::Pose> model_poses(const std::vector<world::Pose>& poses);
// The model's action of a world action: the keys as they are, the yaw turned in radians (the
// world's pitch turn is not a model input: the pitch reaches the model through the pose).
worldkv::Action model_action(const world::Action& a);
std::vector<worldkv::Action> model_actions(const std::vector<world::Action>& actions);

// The session's controls of world frames: each frame's pose and action, as above.
std::vector<worldkv::FrameControl> model_controls(const std::vector<world::Pose>& poses,
                                                  const std::vector<world::Action>& actions);

// The ground-truth render settings that match a model: its frame size and field of view.
world::RenderSpec render_spec_of(const dit::DitConfig& c);
world::RenderSpec render_spec_of(const worldkv::ModelInfo& m);

}  // namespace wm::rollout
