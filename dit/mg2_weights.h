#pragma once
// Loading Matrix-Game-2.0's DiT as the hub ships it: a folder with `config.json` beside a
// `.safetensors` checkpoint whose keys carry upstream's `model.` prefix
// (base_distilled_model/base_distill.safetensors, gta_distilled_model/gta_keyboard2dim.safetensors,
// templerun_distilled_model/templerun_7dim_onlykey.safetensors). Strict: every key of the model
// must be in the file with its shape, and nothing else may be.
#include <ATen/ATen.h>

#include <string>

#include "dit/mg2_config.h"
#include "dit/mg2_model.h"

namespace wm::dit {

struct Mg2Files {
  std::string config;   // config.json
  std::string weights;  // the .safetensors checkpoint
};

// The files of a model given its folder (config.json and the one .safetensors in it) or its
// .safetensors file (config.json beside it). Throws wm::Error naming what is missing or ambiguous.
Mg2Files find_mg2_files(const std::string& path);

// Throws wm::Error naming the field, the config's value and the checkpoint's when config.json
// contradicts the checkpoint's shapes (dim, in_dim, out_dim, num_layers, ffn_dim, the action
// blocks, keyboard_dim_in, the mouse branch, the action widths).
void check_mg2_config_against_weights(const Mg2Config& cfg, const std::string& config_path,
                                      const std::string& weights_path);

// Copies the checkpoint into the model (strict; `model.` prefix removed). Throws wm::Error naming
// the file and the key for a missing, unexpected or mis-shaped tensor; the model is unchanged then.
void load_mg2_weights(Mg2DitImpl& model, const std::string& weights_path);

// Config, checks and weights, then the model on `device` in `dtype` (kFloat or kBFloat16), in
// eval mode.
Mg2Dit load_mg2_dit(const std::string& path, at::Device device, at::ScalarType dtype = at::kFloat);

}  // namespace wm::dit
