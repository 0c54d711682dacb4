#include "tools/render/lingbot_render.h"

#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <filesystem>

#include "dit/codec.h"
#include "dit/lingbot_weights.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/progress.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/render/session_render.h"
#include "tools/rollout/lingbot_start.h"
#include "tools/rollout/mg2_start.h"
#include "worldkv/lingbot_adapter.h"
#include "worldkv/session.h"

namespace wm::render {
namespace fs = std::filesystem;

void LingbotRenderOptions::add_to(CLI::App& app) {
  CLI::Option* file = app.add_option("--text-context", text_context,
                                     "LingBot-World-Fast: safetensors with `context` [L, 4096], umT5's output for the "
                                     "prompt (without it or --prompt the DiT attends to zero rows, not to a prompt)");
  app.add_option("--prompt", prompt,
                 "LingBot-World-Fast: the prompt, through the umT5 encoder (models_t5_umt5-xxl-enc-bf16.pth) and "
                 "tokenizer (google/umt5-xxl/) beside the model folder, once at the start, on --device in --dtype")
      ->excludes(file);
  app.add_option("--poses", poses,
                 "LingBot-World-Fast: camera-to-world poses, upstream's poses.npy [N,4,4] (OpenCV) or its folder; "
                 "intrinsics.npy beside it is read (default: a generated --trajectory)");
  app.add_option("--size", size, "LingBot-World-Fast: the video's maximum area as upstream's --size (480*832)");
  app.add_flag("--stream-blocks", stream_blocks,
               "LingBot-World-Fast: read the DiT from its files a block at a time, one block held (the release's 40 "
               "blocks are 37 GB in bf16): for a model larger than memory, at the cost of reading every block each call");
}

namespace {

// The trajectory and the chunks it makes: --poses (all the file covers, or --chunks of it) or a
// generated one (--chunks, 4 by default). Throws wm::Error.
struct PlannedCamera {
  rollout::LingbotTrajectory trajectory;
  int chunks = 0;
};

PlannedCamera plan_camera(const Mg2RenderOptions& c, const LingbotRenderOptions& o) {
  PlannedCamera p;
  p.chunks = c.chunks;
  if (o.poses.empty()) {
    if (p.chunks == 0) p.chunks = 4;
    p.trajectory = rollout::lingbot_generated_trajectory(c.trajectory, 9 + 12 * (p.chunks - 1), c.seed);
    return p;
  }
  p.trajectory = rollout::load_lingbot_poses(o.poses);
  const int64_t n = p.trajectory.c2ws.size(0);
  const int covered = int(((n - 1) / 4 + 1) / 3);
  if (covered == 0) throw Error(str_cat(o.poses, ": ", n, " poses; the first chunk needs 9 video frames"));
  if (p.chunks == 0) p.chunks = covered;
  if (p.chunks > covered)
    throw Error(str_cat("--chunks ", p.chunks, " needs ", 9 + 12 * (p.chunks - 1), " poses, ", o.poses, " has ", n));
  // Upstream's frame_num: the video frames the chunks make, poses past them unused.
  const int64_t used = 9 + 12 * (p.chunks - 1);
  p.trajectory.c2ws = p.trajectory.c2ws.narrow(0, 0, used);
  p.trajectory.poses.resize(size_t(used));
  return p;
}

}  // namespace

int run_lingbot_render(const Mg2RenderOptions& c, const LingbotRenderOptions& o) {
  at::NoGradGuard ng;
  const at::Device dev = parse_device(c.device);
  const at::ScalarType dt = c.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  if (c.out.empty() && c.latents_out.empty()) throw Error("nothing to write: give -o OUT.mp4 and/or --latents-out FILE");
  if (c.image.empty()) throw Error("LingBot-World-Fast starts from an image: give --image FILE");
  if (!c.latents_in.empty() || !c.actions.empty() || !c.mode.empty() || !c.clip.empty())
    throw Error("--latents, --actions, --mode and --clip are Matrix-Game-2.0's; LingBot-World-Fast takes --image, "
                "--prompt or --text-context, and --poses or --trajectory");
  session_config(c).check();  // before the minutes of loading
  const PlannedCamera planned = plan_camera(c, o);
  const Image image = media::read_image(c.image);
  const rollout::LingbotVideoSize size = rollout::lingbot_video_size(image.height, image.width, rollout::lingbot_max_area(o.size));

  // The text before the DiT: umT5's encoder is freed first.
  const at::Tensor text = rollout::lingbot_text_context({o.text_context, o.prompt}, c.model, dev, dt, "wm_render");
  std::fprintf(stderr, "wm_render: loading %s (%s%s)\n", c.model.c_str(), c.dtype.c_str(),
               o.stream_blocks ? ", a block at a time" : "");
  dit::LingbotDit model = dit::load_lingbot_dit(c.model, dev, dt, o.stream_blocks);
  if (!text.defined())
    std::fprintf(stderr, "wm_render: no --prompt or --text-context: the DiT attends to %d zero rows, which no prompt "
                         "encodes to\n", int(model->config().text_len));
  std::unique_ptr<dit::WanVaeCodec> vae =
      rollout::load_lingbot_vae(c.model, c.vae, size, dev, dt, at::kFloat, "the image condition needs it");
  const int n_latents = 3 * planned.chunks;
  const int64_t n_cond = c.cond_latents > 0 ? std::min(c.cond_latents, n_latents) : n_latents;
  std::fprintf(stderr, "wm_render: encoding %s at %lldx%lld (%lld latent frames)\n", c.image.c_str(),
               static_cast<long long>(size.width), static_cast<long long>(size.height), static_cast<long long>(n_cond));
  const at::Tensor image_latents = rollout::lingbot_image_latents(image, *vae, n_cond, dev);

  worldkv::LingbotOptions lo;
  lo.trajectory = planned.trajectory.c2ws;
  if (planned.trajectory.intrinsics) lo.intrinsics = *planned.trajectory.intrinsics;
  std::unique_ptr<dit::Codec> codec;
  if (!c.out.empty()) codec = std::move(vae);
  worldkv::WorldSession session(std::make_unique<worldkv::LingbotAdapter>(model, std::move(codec), text,
                                                                          image_latents, lo, dev),
                                session_config(c));
  std::unique_ptr<media::Mp4Writer> writer;
  if (!c.out.empty()) writer = std::make_unique<media::Mp4Writer>(c.out, int(size.width), int(size.height), o.fps, 1);
  const int video_frames = 9 + 12 * (planned.chunks - 1);
  std::fprintf(stderr, "wm_render: LingBot-World-Fast %s, %d chunks (%d video frames), policy %s, %s\n",
               model->config().model_type.c_str(), planned.chunks, video_frames, c.policy.c_str(),
               describe_device(dev).c_str());
  render_session(
      session, c, planned.chunks,
      [&](size_t used, size_t n) {
        std::vector<worldkv::FrameControl> controls(n);
        for (size_t i = 0; i < n; ++i) controls[i].pose = planned.trajectory.poses.at(used + i);
        return controls;
      },
      [](cli::ProgressLine& progress, bool last, int chunk, int chunks, const worldkv::ChunkOutput& out) {
        progress.show(last, "  chunk %d/%d  %.0f ms (DiT %.0f, decode %.0f)  window %zu KiB%s", chunk, chunks, out.ms,
                      out.model_ms, out.decode_ms, out.window_bytes >> 10, out.retrieved.empty() ? "" : "  retrieved");
      },
      5, writer.get());
  return 0;
}

}  // namespace wm::render
