#include "viewer/lingbot_view.h"

#include <cmath>
#include <filesystem>

#include "dit/codec.h"
#include "dit/lingbot_weights.h"
#include "runtime/error.h"
#include "tools/media/png.h"
#include "tools/rollout/lingbot_start.h"
#include "tools/rollout/mg2_start.h"
#include "viewer/palette.h"
#include "worldkv/lingbot_adapter.h"
#include "worldkv/mg2_adapter.h"

namespace wm::viewer {
namespace fs = std::filesystem;

namespace {

void check_lingbot_options(const ViewerOptions& o) {
  if (o.image.empty()) throw Error("LingBot-World-Fast starts from an image: give --image FILE");
  if (!o.latents.empty() || !o.clip.empty() || !o.mode.empty())
    throw Error("--latents, --clip and --mode are Matrix-Game-2.0's; LingBot-World-Fast takes --image and "
                "--prompt or --text-context");
  if (o.dtype != "f32" && o.dtype != "bf16") throw Error(str_cat("--dtype must be f32 or bf16, got '", o.dtype, "'"));
  worldkv::SessionConfig().set_policy(o.policy);
}

// At most `bytes` of UTF-8 text, cut before a whole character, "..." when cut.
std::string short_text(const std::string& s, size_t bytes) {
  if (s.size() <= bytes) return s;
  size_t n = bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

}  // namespace

LingbotView::LingbotView(const ViewerOptions& o) : Mg2KeysView(o, "universal") {
  setup_.header = "LINGBOT-WORLD-FAST";
  setup_.free_clock_fps = 16;
  setup_.new_start = "restart from the image";
  setup_.policy_switch = "restart from the image";
  setup_.state_label = "";
}

std::unique_ptr<worldkv::WorldSession> LingbotView::load() {
  check_lingbot_options(o_);
  const at::Device device = choose_device(o_, setup_.device);
  const at::ScalarType dt = o_.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  at::NoGradGuard no_grad;
  // The prompt first: the umT5 encoder is freed before the DiT is loaded; the adapter keeps the
  // context's K/V for the session.
  const at::Tensor text =
      rollout::lingbot_text_context({o_.text_context, o_.prompt}, o_.model_path, device, dt, "wm_viewer");
  dit::LingbotDit model = dit::load_lingbot_dit(o_.model_path, device, dt);
  const Image image = media::read_image(o_.image);
  const rollout::LingbotVideoSize size =
      rollout::lingbot_video_size(image.height, image.width, rollout::lingbot_max_area(o_.size));
  std::unique_ptr<dit::WanVaeCodec> vae = rollout::load_lingbot_vae(
      o_.model_path, o_.vae, size, device, dt, device.is_cpu() ? at::kFloat : at::kHalf,
      "the viewer starts from the image and decodes every chunk with it");
  setup_.frame_w = vae->image_width();
  setup_.frame_h = vae->image_height();
  setup_.model = fs::absolute(o_.model_path).lexically_normal().filename().string();
  setup_.title = str_cat("lingbot-world-fast (", setup_.model, ")");
  const at::Tensor latents = rollout::lingbot_image_latents(image, *vae, std::max(1, o_.cond_latents), device);
  worldkv::LingbotOptions lo;
  // The longest step between latent frames (4 video frames apart) that the keys make: W and D held.
  lo.translation_scale = 4.0 * std::sqrt(2.0) * kLingbotStep;
  worldkv::SessionConfig sc;
  sc.set_policy(o_.policy);
  sc.seed = o_.seed;
  sc.memory.sink_frames = 3;  // WorldKV's window: sink 3, retrieved 9, recent 3
  sc.memory.retrieved_frames = 9;
  sc.memory.recent_frames = 3;
  sc.memory.bank.device = device;
  return std::make_unique<worldkv::WorldSession>(
      std::make_unique<worldkv::LingbotAdapter>(model, std::move(vae), text, latents, lo, device), sc);
}

worldkv::FrameControl LingbotView::sample() {
  worldkv::FrameControl c = Mg2KeysView::sample();
  pose_ = worldkv::mg2_integrate_pose(pose_, c.mg2, "universal", kLingbotStep, 1.0);
  c.pose = pose_;
  return c;
}

bool LingbotView::restart(bool new_start, const worldkv::Pose* last) {
  pose_ = worldkv::Pose{};
  return Mg2KeysView::restart(new_start, last);  // every rollout starts from the image
}

std::vector<HudLine> LingbotView::model_lines() const {
  if (o_.prompt) return {{"text", str_cat("\"", short_text(*o_.prompt, 40), "\""), palette::kAccent}};
  if (o_.text_context.empty()) return {{"text", "none (zero rows)", palette::kDim}};
  return {{"text", fs::path(o_.text_context).filename().string(), palette::kAccent}};
}

}  // namespace wm::viewer
