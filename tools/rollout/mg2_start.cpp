#include "tools/rollout/mg2_start.h"

#include <cstdio>
#include <filesystem>

#include "dit/clip_vision.h"
#include "dit/mg2_condition.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/media/png.h"

namespace wm::rollout {
namespace fs = std::filesystem;

std::string mg2_file_beside_model(const std::string& model_path, const std::string& given, const std::string& name) {
  if (!given.empty()) return given;
  fs::path p = fs::absolute(fs::path(model_path)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "DIR/"
  std::error_code ec;
  const fs::path folder = fs::is_directory(p, ec) ? p : p.parent_path();
  return (folder.parent_path() / name).string();
}

std::unique_ptr<dit::WanVaeCodec> load_mg2_vae(const std::string& path, const dit::WanVaeCodecOptions& options,
                                               const std::string& why) {
  if (!fs::exists(path)) throw Error(str_cat("no VAE at '", path, "' (pass --vae): ", why));
  return dit::WanVaeCodec::from_file(path, options);
}

Mg2StartTensors load_mg2_start(const Mg2StartFiles& files, const dit::WanVaeCodec* vae, int64_t n_latents,
                               at::Device device) {
  Mg2StartTensors t;
  if (files.image.empty()) {
    SafeTensors st = SafeTensors::open(files.latents);
    for (const char* k : {"image_latents", "clip_tokens"})
      if (!st.contains(k)) throw Error(str_cat(files.latents, ": no tensor '", k, "'"));
    t.image_latents = st.get("image_latents");
    t.clip_tokens = st.get("clip_tokens");
    return t;
  }
  WM_CHECK(vae != nullptr, "encoding ", files.image, " needs the VAE");
  const std::string clip_path =
      mg2_file_beside_model(files.model, files.clip, "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth");
  if (!fs::exists(clip_path)) throw Error(str_cat("no CLIP checkpoint at '", clip_path, "' (pass --clip)"));
  dit::ClipVisionOptions co;
  co.device = device;
  const dit::ClipVision clip = dit::ClipVision::load(clip_path, dit::ClipVisionConfig::vit_h_14(), co);
  std::fprintf(stderr, "encoding %s (%lld latent frames) and its CLIP tokens\n", files.image.c_str(),
               static_cast<long long>(n_latents));
  dit::Mg2Condition cond = dit::mg2_condition(media::read_image(files.image), *vae, clip, n_latents, device);
  t.image_latents = cond.image_latents;
  t.clip_tokens = cond.clip_tokens;
  return t;
}

}  // namespace wm::rollout
