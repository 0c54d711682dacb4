#include "tools/rollout/world_adapter.h"

namespace wm::rollout {

worldkv::Pose model_pose(const world::Pose& p) {
  return worldkv::Pose{p.x, p.y, 0.0, worldkv::radians(p.yaw_deg), worldkv::radians(p.pitch_deg)};
}

world::Pose world_pose(const worldkv::Pose& p) {
  return world::Pose{p.x, p.y, worldkv::degrees(p.yaw), worldkv::degrees(p.pitch)};
}

std::vector<worldkv::Pose> model_poses(const std::vector<world::Pose>& poses) {
  std::vector<worldkv::Pose> out;
  out.reserve(poses.size());
  for (const auto& p : poses) out.push_back(model_pose(p));
  return out;
}

worldkv::Action model_action(const world::Action& a) {
  return worldkv::Action{a.forward, a.strafe, worldkv::radians(a.dyaw_deg)};
}

std::vector<worldkv::Action> model_actions(const std::vector<world::Action>& actions) {
  std::vector<worldkv::Action> out;
  out.reserve(actions.size());
  for (const auto& a : actions) out.push_back(model_action(a));
  return out;
}

std::vector<worldkv::FrameControl> model_controls(const std::vector<world::Pose>& poses,
                                                  const std::vector<world::Action>& actions) {
  return worldkv::pose_controls(model_poses(poses), model_actions(actions));
}

world::RenderSpec render_spec_of(const worldkv::ModelInfo& m) {
  world::RenderSpec rs;
  rs.width = m.frame_width;
  rs.height = m.frame_height;
  rs.fov_deg = m.hfov_deg;
  return rs;
}

world::RenderSpec render_spec_of(const dit::DitConfig& c) {
  world::RenderSpec rs;
  rs.width = c.codec.image_width;
  rs.height = c.codec.image_height;
  rs.fov_deg = c.cond.hfov_deg;
  return rs;
}

}  // namespace wm::rollout
