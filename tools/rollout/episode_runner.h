#pragma once
// Rolling a session through a scene-trajectory pair: the trajectory's poses and actions,
// converted to the model's (world_adapter.h), drive the model chunk by chunk; the generated
// frames and the session's output per chunk (timings, retrieved chunks, the memory's size) are
// kept for the programs that render, score and plot them.
#include <functional>
#include <string>
#include <vector>

#include "dit/image.h"
#include "tools/world/trajectory.h"
#include "worldkv/session.h"

namespace wm::rollout {

struct EpisodeRun {
  std::vector<Image> frames;  // one per trajectory frame (whole chunks only); the first
                              // prompt_frames are the ground-truth prompt, the rest generated
  int prompt_frames = 0;
  std::vector<worldkv::ChunkOutput> chunks;  // the session's output per chunk, its frames moved
                                             // into `frames` (its latents not kept)
  size_t peak_window_bytes = 0;
};

// Frames of the trajectory that the run covers: whole chunks only, for a model whose chunk is
// frames_per_chunk latent frames and whose codec has `temporal_stride` video frames a latent frame
// (the first chunk 1 + s (F - 1) frames, each later one s F); 0 when not even the first fits.
int covered_frames(const world::Episode& ep, int frames_per_chunk, int max_frames = 0, int temporal_stride = 1);

// Runs the session (reset with `seed` first) over the episode's first max_frames frames (0: all),
// calling on_chunk after each chunk (may be empty) with the chunk's output, frames included, and
// the run so far, that chunk included. Each trajectory frame is a video frame of the model (its
// pose and action; a codec of temporal stride s takes 1 + s (F - 1) of them for the first chunk
// and s F for each later one). With prompt (the default) the first chunk is the ground truth
// rendered at its poses, given to the model as its starting view (models that take frames); the
// rest is generated. Throws wm::Error for a model not driven by poses (LingBot-World-Fast) or
// poses and actions (the tiny DiT), and for a prompt the model cannot take.
EpisodeRun run_episode(worldkv::WorldSession& session, const world::Episode& ep, uint64_t seed,
                       int max_frames = 0,
                       const std::function<void(const worldkv::ChunkOutput&, const EpisodeRun&)>& on_chunk = {},
                       bool prompt = true);

}  // namespace wm::rollout
