#include "tools/revisit_bench/lingbot_rollouts.h"

#include <cmath>
#include <filesystem>

#include "dit/codec.h"
#include "dit/lingbot_weights.h"
#include "runtime/error.h"
#include "tools/rollout/lingbot_start.h"
#include "tools/rollout/mg2_start.h"
#include "tools/rollout/world_adapter.h"
#include "worldkv/lingbot_adapter.h"

namespace wm::rollout {
namespace fs = std::filesystem;

LingbotRollouts::LingbotRollouts(LingbotBenchModel m, at::Device device)
    : m_(std::move(m)),
      device_(device),
      text_(lingbot_text_context({m_.text_context, m_.prompt}, m_.dir, device, m_.dtype, "wm_revisit_bench")),
      model_(dit::load_lingbot_dit(m_.dir, device, m_.dtype)) {
  const LingbotVideoSize size = lingbot_video_size(m_.height, m_.width, int64_t(m_.height) * m_.width);
  if (size.height != m_.height || size.width != m_.width)
    throw Error(str_cat("the video size ", m_.width, "x", m_.height, " must be multiples of 16 (upstream's rounding "
                        "makes ", size.width, "x", size.height, ")"));
  vae_path_ = lingbot_vae_path(m_.dir, m_.vae);
  if (!fs::exists(vae_path_)) throw Error(str_cat("no VAE at '", vae_path_, "' (pass --vae)"));
}

world::RenderSpec LingbotRollouts::render_spec() const {
  world::RenderSpec rs;
  rs.width = m_.width;
  rs.height = m_.height;
  rs.fov_deg = worldkv::degrees(2.0 * std::atan(416.0 / worldkv::kLingbotIntrinsics[0]));
  return rs;
}

std::unique_ptr<worldkv::ModelAdapter> LingbotRollouts::make(const world::Episode& ep, int n,
                                                             const Image& frame0) const {
  std::unique_ptr<dit::WanVaeCodec> vae = load_lingbot_vae(m_.dir, vae_path_, {m_.height, m_.width}, device_, m_.dtype,
                                                           at::kFloat, "the first image and the frames need it");
  const int64_t latents = (n - 1) / 4 + 1;
  const int64_t n_cond = m_.cond_latents > 0 ? std::min<int64_t>(m_.cond_latents, latents) : latents;
  const at::Tensor image_latents = lingbot_image_latents(frame0, *vae, n_cond, device_);
  worldkv::LingbotOptions lo;
  lo.trajectory = worldkv::lingbot_c2ws(model_poses(std::vector<world::Pose>(ep.poses.begin(), ep.poses.begin() + n)));
  return std::make_unique<worldkv::LingbotAdapter>(model_, std::move(vae), text_, image_latents, lo, device_);
}

}  // namespace wm::rollout
