#include "tools/render/mg2_render.h"

#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <filesystem>

#include "dit/codec.h"
#include "dit/mg2_weights.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/progress.h"
#include "tools/media/mp4_writer.h"
#include "tools/render/session_render.h"
#include "tools/rollout/mg2_actions.h"
#include "tools/rollout/mg2_start.h"
#include "worldkv/mg2_adapter.h"
#include "worldkv/session.h"

namespace wm::render {
namespace fs = std::filesystem;

void Mg2RenderOptions::add_to(CLI::App& app) {
  app.add_option("--mode", mode, "Matrix-Game-2.0: universal, gta_drive or templerun (checked against the model)")
      ->check(CLI::IsMember({"universal", "gta_drive", "templerun"}));
  app.add_option("--image", image, "Matrix-Game-2.0, LingBot-World-Fast: the first frame (PNG or JPEG)");
  app.add_option("--vae", vae, "Matrix-Game-2.0, LingBot-World-Fast: Wan2.1_VAE.pth or .safetensors (default: Wan2.1_VAE.pth beside the model folder)");
  app.add_option("--clip", clip,
                 "Matrix-Game-2.0: models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (default: beside the model "
                 "folder)");
  app.add_option("--latents", latents_in,
                 "Matrix-Game-2.0: instead of --image, a safetensors file with image_latents [N,16,44,80] and "
                 "clip_tokens [257,1280]");
  app.add_option("--latents-out", latents_out, "Matrix-Game-2.0, LingBot-World-Fast: write the generated latents [N,16,h,w] here");
  app.add_option("--actions", actions, "Matrix-Game-2.0: actions file, one line per video frame: KEYS [PITCH YAW]");
  app.add_option("--trajectory", trajectory, "Matrix-Game-2.0, LingBot-World-Fast: generated actions (LingBot: their poses) when no file: revisit, forward, orbit, random");
  app.add_option("--chunks", chunks, "Matrix-Game-2.0, LingBot-World-Fast: chunks to generate (0: what --actions or --poses covers; 4 for a trajectory)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--sink-frames", sink_frames, "Matrix-Game-2.0, LingBot-World-Fast with a memory policy: sink frames")->check(CLI::Range(0, 300));
  app.add_option("--retrieved-frames", retrieved_frames, "Matrix-Game-2.0, LingBot-World-Fast with a memory policy: retrieved frames")
      ->check(CLI::Range(0, 300));
  app.add_option("--recent-frames", recent_frames, "Matrix-Game-2.0, LingBot-World-Fast with a memory policy: recent frames")
      ->check(CLI::Range(3, 300));
  app.add_option("--kv-files", kv_files,
                 "with a memory policy (any model): keep the window's K/V in files in this "
                 "folder (unnamed, gone with the process), paged to disk by the kernel when memory runs short: for a "
                 "window larger than memory (LingBot-World-Fast's 40 blocks at 480x832 under worldkv: 23 GB in bf16); "
                 "give a folder on a disk, not tmpfs")
      ->check(CLI::ExistingDirectory);
  app.add_option("--dtype", dtype, "Matrix-Game-2.0, LingBot-World-Fast: DiT precision, f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--cond-latents", cond_latents,
                 "Matrix-Game-2.0, LingBot-World-Fast: latent frames of the image condition to encode (0: all; later ones reuse the last)")
      ->check(CLI::Range(0, 100000));
}

namespace {

// What --policy, -o and --latents-out, --image and --latents can be told apart from without
// loading anything. Throws wm::Error.
void check_options(const Mg2RenderOptions& o) {
  if (o.out.empty() && o.latents_out.empty()) throw Error("nothing to write: give -o OUT.mp4 and/or --latents-out FILE");
  if (!o.out.empty() && !o.latents_out.empty() &&
      fs::weakly_canonical(fs::absolute(o.out)) == fs::weakly_canonical(fs::absolute(o.latents_out)))
    throw Error(str_cat("-o and --latents-out name the same file '", o.out, "'"));
  if (o.image.empty() == o.latents_in.empty()) throw Error("give exactly one of --image FILE and --latents FILE");
  session_config(o).check();  // before the minutes of loading
}

// Every video frame's input and the chunks they make: 9 video frames for the first chunk, 12
// for each later one; from --actions (all it covers, or --chunks of it) or a generated trajectory.
struct PlannedInputs {
  std::vector<worldkv::Mg2Input> inputs;
  int chunks = 0;
};

PlannedInputs plan_inputs(const Mg2RenderOptions& o, const std::string& mode) {
  PlannedInputs p;
  p.chunks = o.chunks;
  if (o.actions.empty()) {
    if (p.chunks == 0) p.chunks = 4;
    p.inputs = rollout::mg2_trajectory(o.trajectory, 9 + 12 * (p.chunks - 1), mode, o.seed);
    return p;
  }
  p.inputs = rollout::load_mg2_actions(o.actions, mode);
  const int covered = p.inputs.size() < 9 ? 0 : 1 + int((p.inputs.size() - 9) / 12);
  if (covered == 0) throw Error(str_cat(o.actions, ": ", p.inputs.size(), " frames of actions; the first chunk needs 9"));
  if (p.chunks == 0) p.chunks = covered;
  if (p.chunks > covered)
    throw Error(str_cat("--chunks ", p.chunks, " needs ", 9 + 12 * (p.chunks - 1), " frames of actions, ", o.actions,
                        " has ", p.inputs.size()));
  return p;
}

}  // namespace

int run_mg2_render(const Mg2RenderOptions& o) {
  at::NoGradGuard ng;
  const at::Device dev = parse_device(o.device);
  const at::ScalarType dt = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  check_options(o);  // fail before loading anything
  std::fprintf(stderr, "wm_render: loading %s (%s)\n", o.model.c_str(), o.dtype.c_str());
  dit::Mg2Dit model = dit::load_mg2_dit(o.model, dev, dt);
  const std::string mode = model->config().mode();
  if (!o.mode.empty() && o.mode != mode)
    throw Error(str_cat("--mode ", o.mode, ", but ", o.model, " is a ", mode, " model (its config.json)"));
  const PlannedInputs planned = plan_inputs(o, mode);
  const int n_latents = 3 * planned.chunks;

  // The VAE is needed for an image and for an MP4.
  std::unique_ptr<dit::WanVaeCodec> vae;
  if (!o.image.empty() || !o.out.empty()) {
    dit::WanVaeCodecOptions vo;
    vo.device = dev;
    vo.encode_dtype = dt;
    vo.decode_dtype = at::kFloat;
    vae = rollout::load_mg2_vae(rollout::mg2_file_beside_model(o.model, o.vae, "Wan2.1_VAE.pth"), vo,
                                "an image and an MP4 need it; --latents-out without -o writes latents only");
  }
  const int64_t n_cond = o.cond_latents > 0 ? std::min(o.cond_latents, n_latents) : n_latents;
  const rollout::Mg2StartTensors start = rollout::load_mg2_start({o.model, o.image, o.latents_in, o.clip}, vae.get(), n_cond, dev);
  std::unique_ptr<dit::Codec> codec;
  if (!o.out.empty()) codec = std::move(vae);
  worldkv::WorldSession session(std::make_unique<worldkv::Mg2Adapter>(model, std::move(codec), start.image_latents,
                                                                      start.clip_tokens, worldkv::Mg2Options{}, dev),
                                session_config(o));

  std::unique_ptr<media::Mp4Writer> writer;
  if (!o.out.empty()) writer = std::make_unique<media::Mp4Writer>(o.out, 640, 352, o.fps, 1);
  std::fprintf(stderr, "wm_render: %s model, %d chunks (%d video frames), policy %s, %s\n", mode.c_str(), planned.chunks,
               9 + 12 * (planned.chunks - 1), o.policy.c_str(), describe_device(dev).c_str());
  render_session(
      session, o, planned.chunks,
      [&](size_t used, size_t n) {
        return worldkv::mg2_controls(std::vector<worldkv::Mg2Input>(planned.inputs.begin() + used,
                                                                    planned.inputs.begin() + used + n));
      },
      [](cli::ProgressLine& progress, bool last, int c, int chunks, const worldkv::ChunkOutput& out) {
        progress.show(last, "  chunk %d/%d  %.0f ms (DiT %.0f)  window %zu MiB  action K/V %zu MiB%s", c, chunks,
                      out.ms, out.model_ms, out.window_bytes >> 20, out.state_bytes >> 20,
                      out.retrieved.empty() ? "" : "  retrieved");
      },
      15, writer.get());
  return 0;
}

}  // namespace wm::render
