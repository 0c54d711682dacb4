#include "tools/render/mg2_render.h"

#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "dit/clip_vision.h"
#include "dit/codec.h"
#include "dit/mg2_condition.h"
#include "dit/mg2_weights.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/cli/progress.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/rollout/mg2_actions.h"
#include "worldkv/mg2_adapter.h"
#include "worldkv/session.h"

namespace wm::render {
namespace fs = std::filesystem;

void Mg2RenderOptions::add_to(CLI::App& app) {
  app.add_option("--mode", mode, "Matrix-Game-2.0: universal, gta_drive or templerun (checked against the model)")
      ->check(CLI::IsMember({"universal", "gta_drive", "templerun"}));
  app.add_option("--image", image, "Matrix-Game-2.0: the first frame (PNG or JPEG)");
  app.add_option("--vae", vae, "Matrix-Game-2.0: Wan2.1_VAE.pth (default: beside the model folder)");
  app.add_option("--clip", clip,
                 "Matrix-Game-2.0: models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (default: beside the model "
                 "folder)");
  app.add_option("--latents", latents_in,
                 "Matrix-Game-2.0: instead of --image, a safetensors file with image_latents [N,16,44,80] and "
                 "clip_tokens [257,1280]");
  app.add_option("--latents-out", latents_out, "Matrix-Game-2.0: write the generated latents [N,16,44,80] here");
  app.add_option("--actions", actions, "Matrix-Game-2.0: actions file, one line per video frame: KEYS [PITCH YAW]");
  app.add_option("--trajectory", trajectory, "Matrix-Game-2.0: generated actions when no file: revisit, forward, orbit, random");
  app.add_option("--chunks", chunks, "Matrix-Game-2.0: chunks to generate (0: what --actions covers; 4 for a trajectory)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--sink-frames", sink_frames, "Matrix-Game-2.0 with a memory policy: sink frames")->check(CLI::Range(0, 300));
  app.add_option("--retrieved-frames", retrieved_frames, "Matrix-Game-2.0 with a memory policy: retrieved frames")
      ->check(CLI::Range(0, 300));
  app.add_option("--recent-frames", recent_frames, "Matrix-Game-2.0 with a memory policy: recent frames")
      ->check(CLI::Range(3, 300));
  app.add_option("--dtype", dtype, "Matrix-Game-2.0: DiT precision, f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--cond-latents", cond_latents,
                 "Matrix-Game-2.0: latent frames of the image condition to encode (0: all; later ones reuse the last)")
      ->check(CLI::Range(0, 100000));
}

namespace {

std::string beside_model(const std::string& model, const std::string& name) {
  fs::path p = fs::is_directory(model) ? fs::path(model) : fs::path(model).parent_path();
  return (p.parent_path() / name).string();
}

}  // namespace

int run_mg2_render(const Mg2RenderOptions& o) {
  at::NoGradGuard ng;
  const at::Device dev = parse_device(o.device);
  const at::ScalarType dt = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  if (o.out.empty() && o.latents_out.empty()) throw Error("nothing to write: give -o OUT.mp4 and/or --latents-out FILE");
  if (!o.out.empty() && !o.latents_out.empty() &&
      fs::weakly_canonical(fs::absolute(o.out)) == fs::weakly_canonical(fs::absolute(o.latents_out)))
    throw Error(str_cat("-o and --latents-out name the same file '", o.out, "'"));
  if (o.image.empty() == o.latents_in.empty()) throw Error("give exactly one of --image FILE and --latents FILE");
  worldkv::SessionConfig().set_policy(o.policy);  // fail before loading anything

  std::fprintf(stderr, "wm_render: loading %s (%s)\n", o.model.c_str(), o.dtype.c_str());
  dit::Mg2Dit model = dit::load_mg2_dit(o.model, dev, dt);
  const std::string mode = model->config().mode();
  if (!o.mode.empty() && o.mode != mode)
    throw Error(str_cat("--mode ", o.mode, ", but ", o.model, " is a ", mode, " model (its config.json)"));

  // Actions and chunk count: 9 video frames for the first chunk, 12 for each later one.
  std::vector<worldkv::Mg2Input> inputs;
  int chunks = o.chunks;
  if (!o.actions.empty()) {
    inputs = rollout::load_mg2_actions(o.actions, mode);
    const int covered = inputs.size() < 9 ? 0 : 1 + int((inputs.size() - 9) / 12);
    if (covered == 0)
      throw Error(str_cat(o.actions, ": ", inputs.size(), " frames of actions; the first chunk needs 9"));
    if (chunks == 0) chunks = covered;
    if (chunks > covered)
      throw Error(str_cat("--chunks ", chunks, " needs ", 9 + 12 * (chunks - 1), " frames of actions, ", o.actions,
                          " has ", inputs.size()));
  } else {
    if (chunks == 0) chunks = 4;
    inputs = rollout::mg2_trajectory(o.trajectory, 9 + 12 * (chunks - 1), mode, o.seed);
  }
  const int n_latents = 3 * chunks;

  // The VAE is needed for an image and for an MP4.
  std::unique_ptr<dit::WanVaeCodec> vae;
  if (!o.image.empty() || !o.out.empty()) {
    const std::string vae_path = o.vae.empty() ? beside_model(o.model, "Wan2.1_VAE.pth") : o.vae;
    if (!fs::exists(vae_path))
      throw Error(str_cat("no VAE at '", vae_path, "' (pass --vae, or --latents-out without -o for latents only)"));
    dit::WanVaeCodecOptions vo;
    vo.device = dev;
    vo.encode_dtype = dt;
    vo.decode_dtype = at::kFloat;
    vae = dit::WanVaeCodec::from_file(vae_path, vo);
  }
  at::Tensor image_latents, clip_tokens;
  if (!o.image.empty()) {
    const std::string clip_path =
        o.clip.empty() ? beside_model(o.model, "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth") : o.clip;
    if (!fs::exists(clip_path)) throw Error(str_cat("no CLIP checkpoint at '", clip_path, "' (pass --clip)"));
    dit::ClipVisionOptions co;
    co.device = dev;
    const dit::ClipVision clip = dit::ClipVision::load(clip_path, dit::ClipVisionConfig::vit_h_14(), co);
    const Image first = media::read_image(o.image);
    const int64_t n_cond = o.cond_latents > 0 ? std::min(o.cond_latents, n_latents) : n_latents;
    std::fprintf(stderr, "wm_render: encoding the condition (%lld latent frames) and CLIP tokens\n",
                 static_cast<long long>(n_cond));
    dit::Mg2Condition cond = dit::mg2_condition(first, *vae, clip, n_cond, dev);
    image_latents = cond.image_latents;
    clip_tokens = cond.clip_tokens;
  } else {
    SafeTensors st = SafeTensors::open(o.latents_in);
    for (const char* k : {"image_latents", "clip_tokens"})
      if (!st.contains(k)) throw Error(str_cat(o.latents_in, ": no tensor '", k, "'"));
    image_latents = st.get("image_latents");
    clip_tokens = st.get("clip_tokens");
  }

  worldkv::SessionConfig sc;
  sc.set_policy(o.policy);
  sc.seed = o.seed;
  sc.memory.sink_frames = o.sink_frames;
  sc.memory.retrieved_frames = o.retrieved_frames;
  sc.memory.recent_frames = o.recent_frames;
  sc.memory.placement = worldkv::parse_placement(o.placement);
  std::unique_ptr<dit::Codec> codec;
  if (!o.out.empty()) codec = std::move(vae);
  worldkv::WorldSession session(
      std::make_unique<worldkv::Mg2Adapter>(model, std::move(codec), image_latents, clip_tokens, worldkv::Mg2Options{}, dev),
      sc);

  std::unique_ptr<media::Mp4Writer> writer;
  if (!o.out.empty()) writer = std::make_unique<media::Mp4Writer>(o.out, 640, 352, o.fps, 1);
  std::vector<at::Tensor> latents;
  cli::ProgressLine progress;
  std::fprintf(stderr, "wm_render: %s model, %d chunks (%d video frames), policy %s, %s\n", mode.c_str(), chunks,
               9 + 12 * (chunks - 1), o.policy.c_str(), describe_device(dev).c_str());
  size_t used = 0;
  double dit_ms = 0, total_ms = 0;
  for (int c = 0; c < chunks; ++c) {
    const int n = session.controls_for_next_chunk();
    std::vector<worldkv::Mg2Input> in(inputs.begin() + used, inputs.begin() + used + n);
    used += n;
    worldkv::ChunkOutput out = session.next(worldkv::mg2_controls(in));
    dit_ms += out.model_ms;
    total_ms += out.ms;
    latents.push_back(out.latents);
    if (writer)
      for (const auto& f : out.frames) writer->write(f);
    progress.show(c + 1 == chunks, "  chunk %d/%d  %.0f ms (DiT %.0f)  window %zu MiB  action K/V %zu MiB%s", c + 1,
                  chunks, out.ms, out.model_ms, out.window_bytes >> 20, out.state_bytes >> 20,
                  out.retrieved.empty() ? "" : "  retrieved");
  }
  progress.finish();
  if (writer) writer->finish();
  if (!o.latents_out.empty()) save_safetensors(o.latents_out, {{"latents", at::cat(latents, 0)}});
  if (writer) writer->close();
  std::fprintf(stderr, "wm_render: %d chunks, mean %.0f ms a chunk (DiT %.0f ms), %.2f video frames/s%s%s\n", chunks,
               total_ms / chunks, dit_ms / chunks, 1000.0 * (9 + 12 * (chunks - 1)) / total_ms,
               o.out.empty() ? "" : ("; wrote " + o.out).c_str(),
               o.latents_out.empty() ? "" : ("; latents " + o.latents_out).c_str());
  return 0;
}

}  // namespace wm::render
