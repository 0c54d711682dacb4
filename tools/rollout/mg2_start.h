#pragma once
// What a Matrix-Game-2.0 rollout starts from, read from the files a user names (wm_render and
// the viewer alike): the hub's files beside the model folder, the Wan VAE, and the condition of
// the first frame, either encoded from an image (the VAE and the CLIP tower, as upstream's
// inference.py does) or read from a safetensors file that holds it already.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dit/codec.h"

namespace wm::rollout {

// `given` if set, else `name` in the folder above the model's folder (the hub's layout:
// Matrix-Game-2.0/base_distilled_model/... beside Matrix-Game-2.0/Wan2.1_VAE.pth). model_path
// is the folder or a file in it.
std::string mg2_file_beside_model(const std::string& model_path, const std::string& given, const std::string& name);

// The Wan VAE of `path` (already resolved) with these options. Throws wm::Error naming the path
// when there is none, `why` saying what needs it.
std::unique_ptr<dit::WanVaeCodec> load_mg2_vae(const std::string& path, const dit::WanVaeCodecOptions& options,
                                               const std::string& why);

struct Mg2StartFiles {
  std::string model;    // the DiT's folder or .safetensors (where the CLIP file is looked for)
  std::string image;    // the first frame (PNG/JPEG), or
  std::string latents;  // a safetensors file with image_latents [N,16,44,80] and clip_tokens [257,1280]
  std::string clip;     // models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (empty: beside the model)
};

struct Mg2StartTensors {
  at::Tensor image_latents;  // [N, 16, h, w] float32
  at::Tensor clip_tokens;    // [257, 1280] float32
};

// From files.image (encoding n_latents latent frames with `vae`, which must then be given) or
// files.latents. Throws wm::Error naming the file that is missing or lacks a tensor.
Mg2StartTensors load_mg2_start(const Mg2StartFiles& files, const dit::WanVaeCodec* vae, int64_t n_latents,
                               at::Device device);

}  // namespace wm::rollout
