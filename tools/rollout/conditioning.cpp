#include "tools/rollout/conditioning.h"

#include <cmath>

#include "runtime/error.h"

namespace wm::rollout {

at::Tensor pose_tensor(const std::vector<world::Pose>& poses) {
  at::Tensor t = at::empty({static_cast<int64_t>(poses.size()), 3}, at::kFloat);
  auto a = t.accessor<float, 2>();
  for (size_t i = 0; i < poses.size(); ++i) {
    a[i][0] = static_cast<float>(poses[i].x);
    a[i][1] = static_cast<float>(poses[i].y);
    a[i][2] = static_cast<float>(poses[i].yaw_deg);
  }
  return t;
}

at::Tensor action_tensor(const std::vector<world::Action>& actions, int action_dim) {
  WM_CHECK(action_dim == 5, "the world's actions map to 5 features (W, S, A, D, yaw delta), the model wants ",
           action_dim);
  at::Tensor t = at::zeros({static_cast<int64_t>(actions.size()), 5}, at::kFloat);
  auto a = t.accessor<float, 2>();
  for (size_t i = 0; i < actions.size(); ++i) {
    a[i][0] = actions[i].forward > 0;
    a[i][1] = actions[i].forward < 0;
    a[i][2] = actions[i].strafe < 0;
    a[i][3] = actions[i].strafe > 0;
    a[i][4] = static_cast<float>(actions[i].dyaw_deg);
  }
  return t;
}

worldkv::Pose memory_pose(const world::Pose& p) {
  constexpr double kDeg = 3.14159265358979323846 / 180.0;
  return worldkv::Pose{p.x, p.y, 0.0, p.yaw_deg * kDeg, p.pitch_deg * kDeg};
}

std::vector<worldkv::Pose> memory_poses(const std::vector<world::Pose>& p) {
  std::vector<worldkv::Pose> out;
  out.reserve(p.size());
  for (auto& x : p) out.push_back(memory_pose(x));
  return out;
}

world::RenderSpec render_spec_of(const dit::DitConfig& c) {
  world::RenderSpec rs;
  rs.width = c.codec.image_width;
  rs.height = c.codec.image_height;
  rs.fov_deg = c.cond.hfov_deg;
  return rs;
}

dit::SamplerConfig sampler_with_steps(int n) {
  WM_CHECK(n >= 1, "a sampler needs at least one step, got ", n);
  dit::SamplerConfig sc;
  sc.timesteps.clear();
  for (int i = 0; i < n; ++i) sc.timesteps.push_back(1.0 - static_cast<double>(i) / n);
  return sc;
}

}  // namespace wm::rollout
