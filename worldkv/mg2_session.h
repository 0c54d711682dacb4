#pragma once
// A streaming Matrix-Game-2.0 session: the DiT generating chunk by chunk (3 latent frames, 12
// video frames after the first chunk's 9) from per-video-frame keyboard and mouse inputs, over
// either upstream's own rolling window ("native") or the world memory's window under any video
// policy (sliding_window, worldkv, worldkv_c, ...).
//
// The action modules' K/V travel with their chunk: the session keeps each chunk's keyboard and
// mouse K/V under the chunk's id for as long as the chunk is in the window or in the bank, and
// the chunk's action context is built from the chunks the window holds, in window order. A chunk
// placed re-anchored has its action keys re-anchored by the same number of latent frames. A
// compressed chunk (worldkv_c) keeps its action K/V whole: they are per latent frame (keyboard)
// and per spatial token over frames (mouse), and the key-key selection of main tokens does not
// apply to them.
//
// Retrieval pose (as WorldKV does for MG2): W/S move forward/back and A/D strafe along the
// accumulated yaw by translation_scale per video frame (universal and gta_drive; templerun's
// moves are mapped to turns and steps), and the mouse's pitch and yaw accumulate into the
// rotation, rotation_scale radians per unit. A latent frame's pose is that of its last video frame.
#include <ATen/ATen.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dit/codec.h"
#include "dit/image.h"
#include "dit/mg2_model.h"
#include "dit/mg2_sampler.h"
#include "worldkv/pose.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {

// One video frame's control input, in MG2's terms.
struct Mg2Input {
  std::vector<float> keyboard;  // keyboard_dim values (universal: W S A D; gta_drive: W S;
                                // templerun: one-hot of 7)
  float pitch = 0;              // mouse, + looks up (upstream demos: +-0.1 a frame)
  float yaw = 0;                // mouse, + turns right
};

struct Mg2SessionConfig {
  std::string policy = "native";  // "native": upstream's rolling window; else a video policy
  MemoryConfig memory;            // the world memory's sizes when policy is not native
  std::vector<int> steps;         // denoising steps (empty: the release's)
  uint64_t seed = 0;              // noise of every chunk is drawn from this
  double translation_scale = 1.0; // pose units a video frame of W/S/A/D moves
  double rotation_scale = 1.0;    // radians per unit of mouse pitch/yaw
};

struct Mg2ChunkOutput {
  int64_t index = 0;
  at::Tensor latents;            // [3, 16, 44, 80] float32, clean
  std::vector<Image> frames;     // decoded video frames (empty without a codec)
  double ms = 0;                 // wall time of the chunk
  double dit_ms = 0;             // of which the DiT (steps and refresh)
  double decode_ms = 0;          // and the codec's decode (0 without a codec)
  std::vector<std::string> retrieved;  // chunks in the retrieved region (world memory only)
  size_t window_bytes = 0;       // main window (or rolling cache) bytes after the chunk
  size_t action_bytes = 0;       // action K/V kept (window and bank)
  std::array<size_t, 3> bank_bytes{};
};

class Mg2Session {
 public:
  // codec may be null (latents only). Throws wm::Error on a bad config or policy name.
  Mg2Session(dit::Mg2Dit model, std::unique_ptr<dit::Codec> codec, Mg2SessionConfig cfg, at::Device device);

  // The conditioning of a rollout: image_latents [N, 16, 44, 80] (the VAE encoding of [image,
  // zeros x 4(N-1)]; frames past N reuse the last one, which the encoding of zero frames has
  // converged to) and clip_tokens [257, 1280]. Resets the rollout.
  void start(const at::Tensor& image_latents, const at::Tensor& clip_tokens);
  // The next chunk from its video frames' inputs: 1 + 4 * (frames_per_chunk - 1) (9) for the first
  // chunk, 4 * frames_per_chunk (12) after. Throws wm::Error on a wrong count or width.
  Mg2ChunkOutput next(const std::vector<Mg2Input>& inputs);
  // Video frames of input the next chunk takes.
  int inputs_for_next_chunk() const;
  int64_t chunks_done() const { return next_index_; }
  const dit::Mg2Dit& model() const { return model_; }
  const Mg2SessionConfig& config() const { return cfg_; }
  // The world memory (null for the native window).
  const WorldMemory* memory() const { return memory_.get(); }
  // Pose of every video frame so far.
  const std::vector<Pose>& poses() const { return poses_; }

 private:
  dit::Mg2Actions actions_tensor() const;
  dit::ActionKv action_context() const;
  void prune_action_kv();

  dit::Mg2Dit model_;
  std::unique_ptr<dit::Codec> codec_;
  Mg2SessionConfig cfg_;
  at::Device device_;
  dit::Mg2Schedule schedule_;
  std::unique_ptr<dit::Mg2NativeCache> native_;
  std::unique_ptr<WorldMemory> memory_;
  std::map<std::string, dit::ActionKv> action_kv_;  // by chunk id (world memory only)
  at::Tensor image_latents_;
  dit::Mg2Visual visual_;
  std::vector<Mg2Input> inputs_;
  std::vector<Pose> poses_;
  at::Generator gen_;
  int64_t next_index_ = 0;
  bool started_ = false;
};

// The pose after one more video frame of input, from `p` (see above); mode is the model's.
Pose mg2_integrate_pose(const Pose& p, const Mg2Input& in, const std::string& mode, double translation_scale,
                        double rotation_scale);

}  // namespace wm::worldkv
