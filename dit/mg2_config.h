#pragma once
// The shape of Matrix-Game-2.0's DiT (an i2v CausalWanModel with a keyboard/mouse ActionModule),
// read from the `config.json` that ships beside its checkpoint (the hub's format: dim, ffn_dim,
// num_heads, num_layers, in_dim, out_dim, local_attn_size, sink_size, action_config{...}).
//
// Fixed by the upstream code rather than the file: patch (1, 2, 2), the latent grid 44 x 80
// (880 tokens a latent frame), 3 latent frames a chunk, CLIP tokens 257 x 1280, qk_norm and
// cross_attn_norm on. Only the i2v model type exists upstream; anything else is refused.
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace wm::dit {

// The keyboard/mouse module of the blocks listed in `blocks` (upstream's action_config).
struct Mg2ActionConfig {
  std::vector<int> blocks;        // DiT blocks that carry an action module (0..14 in the releases)
  bool enable_keyboard = true;
  bool enable_mouse = true;
  int heads_num = 16;
  int hidden_size = 128;          // keyboard embedding width per video frame
  int img_hidden_size = 1536;     // the DiT's dim
  int keyboard_dim_in = 4;        // 4 universal (W S A D), 2 gta_drive, 7 templerun
  int keyboard_hidden_dim = 1024; // keyboard attention width (heads_num x head dim)
  int mouse_dim_in = 2;           // [pitch, yaw]
  int mouse_hidden_dim = 1024;    // mouse attention width
  std::vector<int> rope_dim_list{8, 28, 28};      // action RoPE split (t, h, w) of the head dim
  std::vector<int> mouse_qk_dim_list{8, 28, 28};
  double rope_theta = 256;
  int vae_time_compression_ratio = 4;  // video frames per latent frame
  int windows_size = 3;                // latent frames of actions each latent frame reads
  bool qk_norm = true;
  bool qkv_bias = false;

  int keyboard_head_dim() const { return keyboard_hidden_dim / heads_num; }
  int mouse_head_dim() const { return mouse_hidden_dim / heads_num; }
  // Video frames of actions one latent frame reads (12).
  int window_frames() const { return vae_time_compression_ratio * windows_size; }
  bool has_block(int l) const;
};

struct Mg2Config {
  std::string model_type = "i2v";
  int dim = 1536;
  int ffn_dim = 8960;
  int freq_dim = 256;
  int num_heads = 12;
  int num_layers = 30;
  int in_dim = 36;   // noise 16 | mask 4 | image latent 16
  int out_dim = 16;
  double eps = 1e-6;
  int local_attn_size = 6;  // latent frames the self-attention sees, the current chunk included
  int sink_size = 0;
  std::optional<Mg2ActionConfig> action;  // absent: no action module

  // Fixed upstream (not read from config.json); the latent grid may be set in code for small
  // test models of the same architecture.
  int patch_t = 1, patch_h = 2, patch_w = 2;
  int latent_height = 44, latent_width = 80;
  int frames_per_chunk = 3;
  int clip_tokens = 257, clip_dim = 1280;

  int head_dim() const { return dim / num_heads; }
  int grid_h() const { return latent_height / patch_h; }
  int grid_w() const { return latent_width / patch_w; }
  int tokens_per_frame() const { return grid_h() * grid_w(); }
  int latent_channels() const { return out_dim; }
  int cond_channels() const { return in_dim - out_dim; }  // mask 4 + image latent 16
  int keyboard_dim() const { return action && action->enable_keyboard ? action->keyboard_dim_in : 0; }
  int mouse_dim() const { return action && action->enable_mouse ? action->mouse_dim_in : 0; }
  // "universal", "gta_drive", "templerun" when the action module matches a release, else "custom".
  std::string mode() const;

  // Throws wm::Error naming the field on any inconsistency.
  void validate() const;
};

// Parses the hub's config.json; `where` (the file) prefixes errors. Unknown fields that upstream
// ignores (_class_name, text_len, ...) are accepted; a field of the wrong type or value is an
// error naming it.
Mg2Config mg2_config_from_json(const nlohmann::json& j, const std::string& where = "config.json");
Mg2Config load_mg2_config(const std::string& path);
nlohmann::json mg2_config_to_json(const Mg2Config& c);

}  // namespace wm::dit
