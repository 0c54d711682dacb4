#pragma once
// The shape of LingBot-World-Fast's DiT (upstream WanModelFast, wan/modules/model_fast.py of
// Robbyant/lingbot-world), read from the `config.json` that diffusers' ConfigMixin writes beside
// the weights: model_type, control_type, text_len, in_dim, dim, ffn_dim, freq_dim, out_dim,
// num_heads, num_layers, local_attn_size, sink_size, eps. A field the file lacks takes
// WanModelFast's constructor default, as from_pretrained would.
//
// Fixed upstream rather than read (ignore_for_config): patch (1, 2, 2), qk_norm and
// cross_attn_norm on, text_dim 4096 (the umT5-XXL width). This reader also takes `text_dim` from
// the file, for reduced test models. The camera input is control_dim x 64 channels a latent pixel
// (6 for 'cam': ray origin and direction of each pixel of the 8 x 8 block; 7 for 'act').
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace wm::dit {

struct LingbotConfig {
  std::string model_type = "t2v";   // "i2v": noise | mask 4 | image latent 16; "t2v": noise only
  std::string control_type = "cam";  // "cam" or "act"
  int text_len = 512;                // context tokens after zero padding
  int in_dim = 16;
  int dim = 2048;
  int ffn_dim = 8192;
  int freq_dim = 256;
  int text_dim = 4096;
  int out_dim = 16;
  int num_heads = 16;
  int num_layers = 32;
  int local_attn_size = -1;  // latent frames of the rolling cache, the current chunk included; -1: all
  int sink_size = 0;         // first latent frames the rolling cache never evicts
  double eps = 1e-6;

  // Fixed upstream.
  int patch_t = 1, patch_h = 2, patch_w = 2;
  int frames_per_chunk = 3;  // generate_fast.py's chunk_size

  int head_dim() const { return dim / num_heads; }
  int control_dim() const { return control_type == "act" ? 7 : 6; }
  // Channels of the folded camera input a latent pixel (control_dim x 8 x 8 = 384 for 'cam').
  int camera_channels() const { return control_dim() * 64; }
  // Inputs of patch_embedding_wancamctrl (camera_channels x patch volume = 1536 for 'cam').
  int camera_patch_inputs() const { return camera_channels() * patch_t * patch_h * patch_w; }
  int cond_channels() const { return in_dim - out_dim; }  // mask 4 + image latent 16 (i2v), 0 (t2v)

  // Throws wm::Error naming the field on any inconsistency.
  void validate() const;
};

// Parses config.json; `where` (the file) prefixes errors. Fields that start with '_' and the
// fields upstream ignores are accepted; a field of the wrong type or value is an error naming it.
LingbotConfig lingbot_config_from_json(const nlohmann::json& j, const std::string& where = "config.json");
LingbotConfig load_lingbot_config(const std::string& path);
// The fields the reader takes, as diffusers writes them (plus text_dim).
nlohmann::json lingbot_config_to_json(const LingbotConfig& c);

}  // namespace wm::dit
