#pragma once
// Loading LingBot-World-Fast's DiT as the hub ships it (robbyant/lingbot-world-fast, saved by
// diffusers' ModelMixin): a folder with `config.json` and either
// `diffusion_pytorch_model.safetensors.index.json` (a weight_map from Wan-native key to shard file)
// beside its shards, or `diffusion_pytorch_model.safetensors`, or else the folder's only
// `.safetensors` file (an index is preferred to the single file). Strict: every key of the model
// must be in the files with its shape, and nothing else may be.
#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

#include "dit/lingbot_config.h"
#include "dit/lingbot_model.h"

namespace wm::dit {

struct LingbotFiles {
  std::string config;                       // config.json
  std::string index;                        // the index json ("" for a single file)
  std::map<std::string, std::string> keys;  // tensor key -> the file holding it (full path)
};

// The files of the model in folder `dir`, the index read (each shard named must exist). Throws
// wm::Error naming the folder, the index or the missing shard and a key it should hold.
LingbotFiles find_lingbot_files(const std::string& dir);

// Copies the checkpoint into the model by key (a streamed model, LingbotDitImpl's: its resident
// parameters, every block's keys checked against its slot's shapes, and the model then reads each
// block from the files as it runs, each time checked for NaN and inf). Every file's header is checked first: a key of the
// model the index (or file) lacks, a key the index names that its shard lacks, an unexpected key,
// a wrong shape or a non-float tensor throws wm::Error naming the file and the key, before
// anything is copied. A tensor holding NaN or inf throws during the copy (the model is then
// partly loaded).
void load_lingbot_weights(LingbotDitImpl& model, const LingbotFiles& files);

// Writes the model into folder `dir` as the hub lays it out (diffusers' save_pretrained):
// config.json (lingbot_config_to_json), and the tensors by Wan-native key in the model's dtype,
// split in key order into shards of at most shard_bytes each (a larger tensor gets a shard of
// its own): `diffusion_pytorch_model-0000N-of-0000M.safetensors` with
// `diffusion_pytorch_model.safetensors.index.json` (metadata.total_size, weight_map), or one
// `diffusion_pytorch_model.safetensors` when everything fits in one. The folder is made; files
// of those names are replaced (each written whole). Throws wm::Error on an I/O failure.
void save_lingbot_dit(const LingbotDitImpl& model, const std::string& dir, int64_t shard_bytes = int64_t(5) << 30);

// The same files for a model too large to hold: `keys` (Wan-native key, bytes) in the order they
// are written, and next(i) makes key i's tensor when its shard is written (in order, each once), so
// that no more than one shard's tensors are held. A tensor of other than the announced bytes throws.
void save_lingbot_dit_streamed(const LingbotConfig& config, const std::vector<std::pair<std::string, int64_t>>& keys,
                               const std::function<at::Tensor(size_t)>& next, const std::string& dir,
                               int64_t shard_bytes = int64_t(5) << 30);

// Config, weights, then the model on `device` in `dtype` (kFloat, kBFloat16 or kHalf), in eval mode.
// streamed: layer-wise from disk, one block held at a time (LingbotDitImpl's constructor).
LingbotDit load_lingbot_dit(const std::string& dir, at::Device device, at::ScalarType dtype = at::kFloat,
                            bool streamed = false);

}  // namespace wm::dit
