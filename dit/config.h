#pragma once
// The shape of a causal DiT of the Wan family (Self-Forcing, CausVid, Matrix-Game-2.0) and of
// its conditioning and codec, read from configs/*.json.
//
// Layout conventions used everywhere in dit/:
//   latents    [F, C, h, w] float (F frames of C channels, h x w latent pixels)
//   tokens     per frame, row-major over the (h / ph) x (w / pw) patch grid; frames in order
//   positions  [n, 3] int64 (t = absolute latent frame index, h = patch row, w = patch column)
//   pose       per frame [x, y, yaw_deg] (the world's convention: x east, y south, yaw in degrees,
//              0 = facing +x, +90 = facing +y, i.e. positive yaw turns right)
//   action     per frame [action_dim] floats (by default W, S, A, D as 0/1 and the yaw delta in
//              degrees this frame)
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "runtime/kv_spec.h"

namespace wm::dit {

// How frames become latents and back (see codec.h).
struct CodecConfig {
  std::string kind = "pixel_patch";  // "pixel_patch" (space-to-depth) or a named VAE ("wan_vae")
  int stride = 4;                    // spatial down-sampling factor image -> latent
  int image_height = 64;             // RGB frame size the codec consumes and produces
  int image_width = 64;
  // "wan_vae" only: the VAE's weights (Wan2.1_VAE.pth or a .safetensors with the same names), a
  // path as given (relative to the working directory); "" = none, and make_codec throws.
  std::string weights;
  // "wan_vae" only: "float32", "bfloat16" or "float16" for encoder and decoder; "" = as
  // Matrix-Game-2.0 runs it (bfloat16 encoder, float16 decoder).
  std::string dtype;
};

// Per-frame camera/action conditioning and the per-token camera-ray embedding.
struct CondConfig {
  bool pose = true;           // embed each frame's pose [x, y, yaw] into its modulation
  int action_dim = 5;         // 0 disables the action embedding
  bool ray_embedding = true;  // add a per-token embedding of the camera ray (position + ray yaw)
  double hfov_deg = 90.0;     // horizontal field of view of the frames, for the ray yaw per column
  int pos_bands = 6;          // Fourier bands of the camera position (x, y)
  double pos_scale = 16.0;    // positions are divided by this before the Fourier features
  int yaw_harmonics = 4;      // (sin, cos)(m * yaw) for m = 1..yaw_harmonics
  int hidden = 0;             // hidden width of the conditioning MLPs (0: dim)
  int yaw_rope_pairs = 0;     // > 0: an extra rotary on q and k over the world yaw of each token's
                              // ray, pair m (m = 1..) turning by m * yaw, on the channels just
                              // after the (t, h, w) RoPE (which must leave 2 * pairs free)
  bool warp_reference = false;  // the chunk being denoised also sees the last clean frame before
                                // it turned by each frame's yaw change, with a coverage mask
                                // (FrameCond::reference), through reference_embedding
  bool reference_residual = false;  // warp_reference and an x0 head: the head draws the difference
                                    // from the turned frame where the reference sees (x0 = head +
                                    // reference latents, which are zero where it does not), so a
                                    // head at zero redraws the last frame turned
};

// Smallest t the x0 head divides by when it turns its output into a velocity (clean context
// frames and the refill pass run at t = 0; their velocity is not used).
inline constexpr double kMinPredictionT = 1e-3;

// What the DiT's head outputs (the config's "prediction").
enum class Prediction {
  V,   // "v": the velocity, as Wan
  X0,  // "x0": the clean latents; forward_* then return the velocity (x_t - x0) / max(t, kMinPredictionT).
       // x0 suits a head as narrow as the patch (the noise need not pass through it)
};
// The config file's name of a prediction: "v" or "x0".
const char* prediction_name(Prediction p);
// The prediction the config file calls `name`; nullopt unless it is "v" or "x0".
std::optional<Prediction> parse_prediction(const std::string& name);

struct DitConfig {
  std::string name = "dit";
  int dim = 128;
  int n_layers = 4;
  int n_heads = 4;
  int head_dim = 32;  // derived: dim / n_heads
  int ffn_dim = 512;
  int patch_t = 1, patch_h = 2, patch_w = 2;
  int latent_channels = 16;
  int latent_height = 16, latent_width = 16;  // one latent frame
  int frames_per_chunk = 3;
  int freq_dim = 256;              // sinusoidal timestep features, as Wan
  double timestep_scale = 1000.0;  // the embedding sees t * timestep_scale (Wan: t in [0, 1000])
  double eps = 1e-6;               // LayerNorm / RMSNorm epsilon
  bool qk_norm = true;             // RMSNorm over q and k (over the full dim, as Wan)
  Prediction prediction = Prediction::V;  // what the head outputs (JSON: "v" or "x0")
  RopeSpec rope;                   // (t, h, w) split; default RopeSpec::video3d(head_dim, 10000)
  CondConfig cond;
  CodecConfig codec;

  int grid_h() const { return latent_height / patch_h; }
  int grid_w() const { return latent_width / patch_w; }
  int tokens_per_frame() const { return grid_h() * grid_w(); }
  int tokens_per_chunk() const { return tokens_per_frame() * frames_per_chunk; }
  int patch_dim() const { return latent_channels * patch_t * patch_h * patch_w; }

  // Throws wm::Error naming the field on any inconsistency (dim % n_heads, patch vs latent size,
  // RoPE split that does not fit head_dim, ...).
  void validate() const;
};

// Parses a config; `where` (a file name) prefixes every error. Missing optional fields take
// the defaults above; unknown fields are rejected. Throws wm::Error "where: field: what".
DitConfig config_from_json(const nlohmann::json& j, const std::string& where = "config");
// Reads and parses a JSON file; errors name the file (and the field).
DitConfig load_config(const std::string& path);
// The config as JSON (round-trips through config_from_json).
nlohmann::json config_to_json(const DitConfig& c);

}  // namespace wm::dit
