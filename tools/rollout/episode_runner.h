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

// Frames of the trajectory that the run covers: whole chunks only.
int covered_frames(const world::Episode& ep, int frames_per_chunk, int max_frames = 0);

// Runs the session (reset with `seed` first) over the episode's first max_frames frames (0: all),
// calling on_chunk after each chunk (may be empty) with the chunk's output, frames included, and
// the run so far, that chunk included. With prompt (the default) the first chunk is
// the ground truth rendered at its poses, given to the model as its starting view; the rest is
// generated. Throws wm::Error for a model not driven by poses and actions frame by frame.
EpisodeRun run_episode(worldkv::WorldSession& session, const world::Episode& ep, uint64_t seed,
                       int max_frames = 0,
                       const std::function<void(const worldkv::ChunkOutput&, const EpisodeRun&)>& on_chunk = {},
                       bool prompt = true);

}  // namespace wm::rollout
