#pragma once
// wm_render's LingBot-World-Fast path: a model folder as the hub lays it out
// (robbyant/lingbot-world-fast: config.json, sharded safetensors + index), a first image, a text
// context (a file, or a prompt through umT5), a camera trajectory (upstream's poses.npy or a generated one), a memory policy; the
// decoded frames to MP4 and/or the latents to safetensors. The options it shares with the
// Matrix-Game-2.0 path (--image, --vae, --chunks, --trajectory, --policy and the region sizes,
// --dtype, --cond-latents, --latents-out, -o, --fps, --seed, --device) come in a
// Mg2RenderOptions; its own are below.
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "tools/render/mg2_render.h"

namespace wm::render {

struct LingbotRenderOptions {
  std::string text_context;  // safetensors with `context` [L, text_dim] (umT5's output)
  std::optional<std::string> prompt;  // text through umT5 instead; neither: zero rows
  std::string poses;         // upstream's poses.npy (or its folder; intrinsics.npy beside it is read)
  std::string size = "480*832";  // upstream's --size: the maximum area of the video
  int fps = 16;              // upstream's sample_fps
  bool stream_blocks = false;  // the DiT read from disk a block at a time (one block held)

  void add_to(CLI::App& app);
};

// Runs it; throws wm::Error on bad input. Returns the process exit code.
int run_lingbot_render(const Mg2RenderOptions& common, const LingbotRenderOptions& o);

}  // namespace wm::render
