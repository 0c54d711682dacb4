#include "viewer/mg2_view.h"

#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "dit/codec.h"
#include "dit/mg2_weights.h"
#include "runtime/error.h"
#include "tools/rollout/mg2_start.h"
#include "worldkv/mg2_adapter.h"

namespace wm::viewer {
namespace fs = std::filesystem;

namespace {

// What the user gives before anything loads: the model, one first frame, the dtype.
void check_options(const ViewerOptions& o) {
  if (o.model_path.empty())
    throw Error("--model: give the Matrix-Game-2.0 model folder (config.json + .safetensors) or its .safetensors");
  if (!fs::exists(o.model_path)) throw Error(str_cat("model '", o.model_path, "' not found"));
  if (o.image.empty() == o.latents.empty())
    throw Error("Matrix-Game-2.0 starts from a first frame: give --image FILE (encoded with the VAE and CLIP) or "
                "--latents FILE (image_latents and clip_tokens)");
  if (o.dtype != "f32" && o.dtype != "bf16") throw Error(str_cat("--dtype must be f32 or bf16, got '", o.dtype, "'"));
  worldkv::SessionConfig().set_policy(o.policy);
}

// "universal/model.safetensors" or the folder's name.
std::string model_name(const std::string& model_path) {
  const fs::path mp = fs::absolute(model_path).lexically_normal();
  return fs::is_directory(mp) ? mp.filename().string() : (mp.parent_path().filename() / mp.filename()).string();
}

}  // namespace

bool is_mg2_model(const std::string& model_path, const std::string& mode) {
  if (!mode.empty()) return true;
  if (model_path.empty()) return false;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return true;
  const fs::path cfg = fs::path(model_path).parent_path() / "config.json";
  if (!fs::is_regular_file(cfg, ec)) return false;
  std::ifstream f(cfg);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("_class_name") && j["_class_name"].is_string() &&
         j["_class_name"].get<std::string>() == "CausalWanModel";
}

Mg2View::Mg2View(const ViewerOptions& o) : Mg2KeysView(o, o.mode.empty() ? "universal" : o.mode) {
  setup_.header = "MATRIX-GAME-2.0";
  setup_.free_clock_fps = 12;
  setup_.new_start = "restart from frame 1";
  setup_.policy_switch = "restart from frame 1";
  setup_.state_label = "act K/V";
}

std::unique_ptr<worldkv::WorldSession> Mg2View::load() {
  check_options(o_);  // fails before anything loads
  const at::Device device = choose_device(o_, setup_.device);
  const at::ScalarType dt = o_.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  at::NoGradGuard no_grad;
  dit::Mg2Dit model = dit::load_mg2_dit(o_.model_path, device, dt);
  const std::string mode = model->config().mode();
  if (!o_.mode.empty() && o_.mode != mode)
    throw Error(str_cat("--mode ", o_.mode, ", but ", o_.model_path, " is a ", mode, " model (its config.json)"));
  set_mode(mode);
  setup_.model = model_name(o_.model_path);
  setup_.title = str_cat("matrix-game-2.0 ", mode, " (", setup_.model, ")");
  dit::WanVaeCodecOptions vo;
  vo.device = device;
  vo.encode_dtype = dt;
  vo.decode_dtype = device.is_cpu() ? at::kFloat : at::kHalf;  // half as upstream where it is fast
  vo.image_height = 8 * model->config().latent_height;        // 352 x 640 for the released models
  vo.image_width = 8 * model->config().latent_width;
  std::unique_ptr<dit::WanVaeCodec> vae =
      rollout::load_mg2_vae(rollout::mg2_file_beside_model(o_.model_path, o_.vae, "Wan2.1_VAE.pth"), vo,
                            "the viewer decodes every chunk with the Wan2.1 VAE");
  setup_.frame_w = vae->image_width();
  setup_.frame_h = vae->image_height();
  const rollout::Mg2StartTensors start =
      rollout::load_mg2_start({o_.model_path, o_.image, o_.latents, o_.clip}, vae.get(), std::max(1, o_.cond_latents), device);
  worldkv::SessionConfig sc;
  sc.set_policy(o_.policy);
  sc.seed = o_.seed;
  sc.memory.sink_frames = 0;  // as wm_render's defaults: 9 retrieved + 3 recent frames
  sc.memory.retrieved_frames = 9;
  sc.memory.recent_frames = 3;
  sc.memory.bank.device = device;
  try {
    return std::make_unique<worldkv::WorldSession>(
        std::make_unique<worldkv::Mg2Adapter>(model, std::move(vae), start.image_latents, start.clip_tokens,
                                              worldkv::Mg2Options{}, device),
        sc);
  } catch (const std::exception& e) {
    throw Error(str_cat("starting the rollout from ", o_.image.empty() ? o_.latents : o_.image, ": ", e.what()));
  }
}

std::vector<HudLine> Mg2View::model_lines() const { return {{"mode", mode_, palette::kAccent}}; }

}  // namespace wm::viewer
