#include "worldkv/model_adapter.h"

#include "runtime/error.h"

namespace wm::worldkv {

SampledChunk ModelAdapter::prompt(const std::vector<Image>& frames, const ChunkStep& step) {
  (void)frames;
  (void)step;
  throw Error(str_cat("the ", info().kind, " model does not start from given frames"));
}

std::vector<FrameControl> pose_controls(const std::vector<Pose>& poses, const std::vector<Action>& actions) {
  WM_CHECK(poses.size() == actions.size(), "one action per pose: got ", poses.size(), " poses and ", actions.size(),
           " actions");
  std::vector<FrameControl> out(poses.size());
  for (size_t i = 0; i < poses.size(); ++i) {
    out[i].pose = poses[i];
    out[i].action = actions[i];
  }
  return out;
}

std::vector<FrameControl> mg2_controls(const std::vector<Mg2Input>& inputs) {
  std::vector<FrameControl> out(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) out[i].mg2 = inputs[i];
  return out;
}

}  // namespace wm::worldkv
