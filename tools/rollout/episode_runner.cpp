#include "tools/rollout/episode_runner.h"

#include <algorithm>

#include "runtime/error.h"
#include "tools/rollout/world_adapter.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"

namespace wm::rollout {

int covered_frames(const world::Episode& ep, int fpc, int max_frames, int stride) {
  int n = ep.frames();
  if (max_frames > 0) n = std::min(n, max_frames);
  const int first = 1 + stride * (fpc - 1), next = stride * fpc;
  return n < first ? 0 : first + (n - first) / next * next;
}

EpisodeRun run_episode(worldkv::WorldSession& session, const world::Episode& ep, uint64_t seed, int max_frames,
                       const std::function<void(const worldkv::ChunkOutput&, const EpisodeRun&)>& on_chunk,
                       bool prompt) {
  const worldkv::ModelInfo& info = session.info();
  WM_CHECK(info.controls == "pose+action" || info.controls == "pose", "the ", info.kind, " model is driven by ",
           info.controls, ", not by an episode's poses and actions frame by frame");
  WM_CHECK(!prompt || info.prompt_frames, "the ", info.kind, " model does not start from given frames (no prompt)");
  const int n = covered_frames(ep, session.frames_per_chunk(), max_frames, info.temporal_stride);
  WM_CHECK(n > 0, "episode '", ep.name, "' has ", ep.frames(), " frames, fewer than one chunk of ",
           session.controls_for_chunk(0));
  session.reset(seed);
  EpisodeRun run;
  run.frames.reserve(n);
  for (int f0 = 0; f0 < n;) {
    const int F = session.controls_for_next_chunk();
    const std::vector<world::Pose> world_poses(ep.poses.begin() + f0, ep.poses.begin() + f0 + F);
    const std::vector<worldkv::FrameControl> controls =
        model_controls(world_poses, std::vector<world::Action>(ep.actions.begin() + f0, ep.actions.begin() + f0 + F));
    worldkv::ChunkOutput out;
    if (prompt && f0 == 0) {
      const world::Scene scene = world::scene_of(ep);
      world::Raycaster ray(scene, render_spec_of(info));
      std::vector<Image> frames;
      for (auto& p : world_poses) frames.push_back(ray.render(p));
      out = session.prompt(frames, controls);
      run.prompt_frames = F;
    } else {
      out = session.next(controls);
    }
    f0 += F;
    run.frames.insert(run.frames.end(), out.frames.begin(), out.frames.end());
    worldkv::ChunkOutput& chunk = run.chunks.emplace_back(std::move(out));
    if (on_chunk) on_chunk(chunk, run);
    chunk.frames = {};  // run.frames holds them
    chunk.latents = at::Tensor();
  }
  run.peak_window_bytes = session.memory() ? session.memory()->peak_window_bytes() : 0;
  return run;
}

}  // namespace wm::rollout
