#pragma once
// What wm_render's Matrix-Game-2.0 (mg2_render.h) and LingBot-World-Fast (lingbot_render.h) paths
// share once their session is built: the session's config from the common options, and the
// rollout chunk by chunk to the MP4 and the latents file, with a progress line and a summary.
#include <functional>
#include <vector>

#include "tools/cli/progress.h"
#include "tools/media/mp4_writer.h"
#include "tools/render/mg2_render.h"
#include "worldkv/session.h"

namespace wm::render {

// --policy, --seed, the region sizes (--sink-frames, --retrieved-frames, --recent-frames) and
// --placement as a session's config. Throws wm::Error for an unknown policy or placement.
worldkv::SessionConfig session_config(const Mg2RenderOptions& o);

// The controls of the next chunk: its `n` video frames after the `used` ones before it.
using ChunkControls = std::function<std::vector<worldkv::FrameControl>(size_t used, size_t n)>;
// Shows chunk `chunk` of `chunks` (1-based) on the progress line; `last` for the final one.
using ShowChunk = std::function<void(cli::ProgressLine& progress, bool last, int chunk, int chunks,
                                     const worldkv::ChunkOutput& out)>;

// Runs `chunks` chunks of `session` (9 video frames the first, 12 each later one) with their
// controls, each chunk's frames to `writer` (null: none) and its line shown on a progress line
// (whole lines at most every `progress_s` seconds off a terminal). Then finishes the MP4, writes
// the latents [N, 16, h, w] to o.latents_out (when given), closes the MP4, and prints the
// summary (chunks, mean time a chunk and the DiT's share, video frames/s, the files written) on
// stderr. Throws what the session and the writers throw.
void render_session(worldkv::WorldSession& session, const Mg2RenderOptions& o, int chunks,
                    const ChunkControls& controls, const ShowChunk& show, double progress_s,
                    media::Mp4Writer* writer);

}  // namespace wm::render
