#include "worldkv/conditioning.h"

#include "runtime/error.h"

namespace wm::worldkv {

at::Tensor pose_tensor(const std::vector<Pose>& poses) {
  at::Tensor t = at::empty({static_cast<int64_t>(poses.size()), 3}, at::kFloat);
  auto a = t.accessor<float, 2>();
  for (size_t i = 0; i < poses.size(); ++i) {
    a[i][0] = static_cast<float>(poses[i].x);
    a[i][1] = static_cast<float>(poses[i].y);
    a[i][2] = static_cast<float>(degrees(poses[i].yaw));
  }
  return t;
}

at::Tensor action_tensor(const std::vector<Action>& actions, int action_dim) {
  WM_CHECK(action_dim == 5, "actions map to 5 features (W, S, A, D, yaw turned), the model wants ", action_dim);
  at::Tensor t = at::zeros({static_cast<int64_t>(actions.size()), 5}, at::kFloat);
  auto a = t.accessor<float, 2>();
  for (size_t i = 0; i < actions.size(); ++i) {
    a[i][0] = actions[i].forward > 0;
    a[i][1] = actions[i].forward < 0;
    a[i][2] = actions[i].strafe < 0;
    a[i][3] = actions[i].strafe > 0;
    a[i][4] = static_cast<float>(degrees(actions[i].yaw));
  }
  return t;
}

dit::FrameCond frame_cond(const std::vector<Pose>& poses, const std::vector<Action>& actions,
                          const dit::CondConfig& c, at::Device device) {
  WM_CHECK(poses.size() == actions.size(), "one action per pose: got ", poses.size(), " poses and ", actions.size(),
           " actions");
  return dit::FrameCond{pose_tensor(poses).to(device), action_tensor(actions, c.action_dim).to(device)};
}

}  // namespace wm::worldkv
