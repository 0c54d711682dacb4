#include "tools/rollout/episode_runner.h"

#include "runtime/error.h"
#include "tools/rollout/world_adapter.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"

namespace wm::rollout {

int covered_frames(const world::Episode& ep, int fpc, int max_frames) {
  int n = ep.frames();
  if (max_frames > 0) n = std::min(n, max_frames);
  return n / fpc * fpc;
}

EpisodeRun run_episode(worldkv::WorldSession& session, const world::Episode& ep, uint64_t seed, int max_frames,
                       const std::function<void(const worldkv::ChunkOutput&, const EpisodeRun&)>& on_chunk,
                       bool prompt) {
  const int F = session.frames_per_chunk();
  WM_CHECK(session.info().temporal_stride == 1 && session.info().controls == "pose+action", "the ",
           session.info().kind, " model is driven by ", session.info().controls,
           ", not by an episode's poses and actions frame by frame");
  const int n = covered_frames(ep, F, max_frames);
  WM_CHECK(n >= F, "episode '", ep.name, "' has ", ep.frames(), " frames, fewer than one chunk of ", F);
  session.reset(seed);
  EpisodeRun run;
  run.frames.reserve(n);
  for (int f0 = 0; f0 < n; f0 += F) {
    const std::vector<world::Pose> world_poses(ep.poses.begin() + f0, ep.poses.begin() + f0 + F);
    const std::vector<worldkv::FrameControl> controls =
        model_controls(world_poses, std::vector<world::Action>(ep.actions.begin() + f0, ep.actions.begin() + f0 + F));
    worldkv::ChunkOutput out;
    if (prompt && f0 == 0) {
      const world::Scene scene = world::scene_of(ep);
      world::Raycaster ray(scene, render_spec_of(session.info()));
      std::vector<Image> frames;
      for (auto& p : world_poses) frames.push_back(ray.render(p));
      out = session.prompt(frames, controls);
      run.prompt_frames = F;
    } else {
      out = session.next(controls);
    }
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
