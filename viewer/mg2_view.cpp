#include "viewer/mg2_view.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "dit/codec.h"
#include "dit/mg2_weights.h"
#include "runtime/error.h"
#include "tools/rollout/mg2_start.h"
#include "viewer/mg2_hud.h"
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

std::optional<Mg2Key> mg2_key(SDL_Scancode sc, const std::string& mode) {
  const bool tr = mode == "templerun";
  switch (sc) {
    case SDL_SCANCODE_W: return Mg2Key::W;
    case SDL_SCANCODE_S: return Mg2Key::S;
    case SDL_SCANCODE_A: return Mg2Key::A;
    case SDL_SCANCODE_D: return Mg2Key::D;
    case SDL_SCANCODE_UP: return Mg2Key::Up;
    case SDL_SCANCODE_DOWN: return Mg2Key::Down;
    case SDL_SCANCODE_LEFT: return Mg2Key::Left;
    case SDL_SCANCODE_RIGHT: return Mg2Key::Right;
    case SDL_SCANCODE_SPACE: return tr ? std::optional<Mg2Key>(Mg2Key::Space) : std::nullopt;
    case SDL_SCANCODE_Q: return tr ? std::optional<Mg2Key>(Mg2Key::Q) : std::nullopt;
    case SDL_SCANCODE_E: return tr ? std::optional<Mg2Key>(Mg2Key::E) : std::nullopt;
    default: return std::nullopt;
  }
}

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

Mg2View::Mg2View(const ViewerOptions& o) : o_(o) {
  setup_.header = "MATRIX-GAME-2.0";
  setup_.free_clock_fps = 12;
  setup_.reference = false;
  setup_.new_start = "restart from frame 1";
  setup_.policy_switch = "restart from frame 1";
  setup_.state_label = "act K/V";
  set_mode(o.mode.empty() ? "universal" : o.mode);
}

void Mg2View::set_mode(const std::string& mode) {
  input_ = std::make_unique<Mg2InputState>(mode);  // throws for a mode the viewer cannot drive
  mode_ = mode;
  setup_.mouse = mode == "universal";
  setup_.keys = input_->keyboard_names();
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

void Mg2View::open(SDL_Renderer* r, uint64_t seed) {
  (void)r;
  (void)seed;  // the first frame's condition is all a rollout starts from
}

bool Mg2View::press(SDL_Scancode key) {
  const auto k = mg2_key(key, mode_);
  if (k) input_->press(*k, key);
  return k.has_value();
}

bool Mg2View::release(SDL_Scancode key) {
  const auto k = mg2_key(key, mode_);
  if (k) input_->release(*k, key);
  return k.has_value();
}

worldkv::FrameControl Mg2View::sample() {
  worldkv::FrameControl c;
  c.mg2 = input_->sample();
  return c;
}

std::vector<Image> Mg2View::prompt(const std::vector<worldkv::FrameControl>& first) {
  (void)first;
  return {};  // the rollout starts from its image condition
}

bool Mg2View::accepts_policy(const std::string& policy) const { return policy != "worldkv_attn"; }

std::string Mg2View::new_start(uint64_t& seed) {
  (void)seed;
  return "restart from frame 1";
}

bool Mg2View::restart(bool new_start, const worldkv::Pose* last) {
  (void)new_start;
  (void)last;
  return false;  // every rollout starts from the first frame
}

bool Mg2View::reference(const worldkv::Pose& pose, Image& out) {
  (void)pose;
  (void)out;
  return false;
}

std::vector<HudLine> Mg2View::model_lines() const { return {{"mode", mode_, palette::kAccent}}; }

std::vector<HudLine> Mg2View::input_lines(const worldkv::FrameControl* shown) const {
  if (!shown) return {{"input", "-", palette::kDim}};
  std::string v = format_mg2_keys(shown->mg2, input_->keyboard_names());
  if (mode_ != "templerun") v += fmt("  p %+.2f", shown->mg2.pitch) + fmt("  y %+.2f", shown->mg2.yaw);
  return {{"input", v}};
}

void Mg2View::draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                         const MemorySnapshot* mem, const worldkv::Pose& pose) const {
  draw_mg2_track(r, font, area, track, mem, pose);
}

std::string Mg2View::help_keys() const { return mg2_help_keys(mode_); }

std::vector<bool> Mg2View::keys_on(const worldkv::FrameControl& c) const {
  std::vector<bool> on(setup_.keys.size(), false);
  for (size_t j = 0; j < on.size() && j < c.mg2.keyboard.size(); ++j) on[j] = c.mg2.keyboard[j] > 0.5f;
  return on;
}

}  // namespace wm::viewer
