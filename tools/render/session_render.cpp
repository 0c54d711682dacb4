#include "tools/render/session_render.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <string>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::render {

worldkv::SessionConfig session_config(const Mg2RenderOptions& o) {
  worldkv::SessionConfig sc;
  sc.set_policy(o.policy);
  sc.seed = o.seed;
  sc.memory.sink_frames = o.sink_frames;
  sc.memory.retrieved_frames = o.retrieved_frames;
  sc.memory.recent_frames = o.recent_frames;
  sc.memory.placement = worldkv::parse_placement(o.placement);
  sc.memory.kv_files_dir = o.kv_files;
  if (!o.kv_files.empty() && !parse_device(o.device).is_cpu())
    throw Error(str_cat("--kv-files keeps the window in files on the CPU; --device ", o.device, " puts it on ",
                        parse_device(o.device), ": give --device cpu"));
  return sc;
}

void render_session(worldkv::WorldSession& session, const Mg2RenderOptions& o, int chunks,
                    const ChunkControls& controls, const ShowChunk& show, double progress_s,
                    media::Mp4Writer* writer) {
  std::vector<at::Tensor> latents;
  double dit_ms = 0, total_ms = 0;
  {
    cli::ProgressLine progress(progress_s);
    size_t used = 0;
    for (int c = 0; c < chunks; ++c) {
      const size_t n = size_t(session.controls_for_next_chunk());
      worldkv::ChunkOutput out = session.next(controls(used, n));
      used += n;
      dit_ms += out.model_ms;
      total_ms += out.ms;
      latents.push_back(out.latents);
      if (writer)
        for (const auto& f : out.frames) writer->write(f);
      show(progress, c + 1 == chunks, c + 1, chunks, out);
    }
    progress.finish();
  }
  if (writer) writer->finish();
  if (!o.latents_out.empty()) save_safetensors(o.latents_out, {{"latents", at::cat(latents, 0)}});
  if (writer) writer->close();
  std::fprintf(stderr, "wm_render: %d chunks, mean %.0f ms a chunk (DiT %.0f ms), %.2f video frames/s%s%s\n", chunks,
               total_ms / chunks, dit_ms / chunks, 1000.0 * (9 + 12 * (chunks - 1)) / total_ms,
               o.out.empty() ? "" : ("; wrote " + o.out).c_str(),
               o.latents_out.empty() ? "" : ("; latents " + o.latents_out).c_str());
}

}  // namespace wm::render
