#pragma once
// Matrix-Game-2.0 (dit/mg2_model.h) as a model kind of the session (worldkv/session.h): the DiT
// generating chunks of 3 latent frames (12 video frames after the first chunk's 9) from each
// video frame's keyboard and mouse input, conditioned on its first image (the VAE's image latents
// and the CLIP tokens, given once), sampled by upstream's schedule (dit/mg2_sampler.h), decoded by
// the Wan VAE when a codec is given. It runs over the world memory's window under any video policy,
// or over upstream's own rolling window ("native", Mg2NativeCache).
//
// The action modules' K/V travel with their chunk: the adapter returns each chunk's keyboard and
// mouse K/V as its chunk state, which the session keeps under the chunk's id for as long as the
// chunk is in the window or in the bank; the chunk's action context is built from the chunks the
// window holds, in window order. A chunk placed re-anchored has its action keys re-anchored by
// the same number of latent frames. A compressed chunk (worldkv_c) keeps its action K/V whole:
// they are per latent frame (keyboard) and per spatial token over frames (mouse), and the
// key-key selection of main tokens does not apply to them.
//
// Retrieval pose (as WorldKV does for MG2): W/S move forward/back and A/D strafe along the
// accumulated yaw by translation_scale per video frame (universal and gta_drive; templerun's
// moves are mapped to turns and steps), and the mouse's pitch and yaw accumulate into the
// rotation, rotation_scale radians per unit.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "dit/codec.h"
#include "dit/mg2_model.h"
#include "dit/mg2_sampler.h"
#include "worldkv/model_adapter.h"
#include "worldkv/wan_i2v.h"

namespace wm::worldkv {

struct Mg2Options {
  std::vector<int> steps;          // denoising steps (empty: the release's)
  double translation_scale = 1.0;  // pose units a video frame of W/S/A/D moves
  double rotation_scale = 1.0;     // radians per unit of mouse pitch/yaw
};

// A chunk's action K/V, its state in the session.
struct Mg2ActionState final : ChunkState {
  dit::ActionKv kv;
  explicit Mg2ActionState(dit::ActionKv k) : kv(std::move(k)) {}
  size_t nbytes() const override { return kv.nbytes(); }
};

class Mg2Adapter final : public ModelAdapter {
 public:
  // The conditioning of every rollout: image_latents [N, 16, h, w] (the VAE encoding of [image,
  // zeros x 4(N-1)]; frames past N reuse the last one, which the encoding of zero frames has
  // converged to) and clip_tokens [257, 1280]. codec may be null (latents only). Throws wm::Error
  // on a wrong shape or step list.
  Mg2Adapter(dit::Mg2Dit model, std::unique_ptr<dit::Codec> codec, const at::Tensor& image_latents,
             const at::Tensor& clip_tokens, Mg2Options options, at::Device device);

  const ModelInfo& info() const override { return info_; }
  KvSpec kv_spec() const override { return model_->kv_spec(device_, model_->dtype()); }
  void check_controls(const std::vector<FrameControl>& controls) const override;
  Pose next_pose(const Pose& previous, const FrameControl& control) const override;
  void reset(bool native) override;
  SampledChunk sample(const ChunkStep& step) override;
  std::vector<Image> decode(const at::Tensor& latents) override;
  size_t native_window_bytes() const override { return native_ ? native_->nbytes() : 0; }
  size_t native_state_bytes() const override { return native_ ? native_->action().nbytes() : 0; }
  std::vector<std::string> native_window_chunks(int64_t index) const override;

  const dit::Mg2Dit& model() const { return model_; }
  const std::string& mode() const { return mode_; }

 private:
  // Keyboard and mouse of every video frame so far.
  dit::Mg2Actions actions_tensor(const std::vector<FrameControl>& controls) const;
  // The held chunks' action K/V in window order, re-anchored as their chunks were.
  dit::ActionKv action_context(const std::vector<HeldChunk>& held) const;

  dit::Mg2Dit model_;
  std::unique_ptr<dit::Codec> codec_;
  Mg2Options opt_;
  at::Device device_;
  std::string mode_;
  ModelInfo info_;
  dit::Mg2Schedule schedule_;
  WanI2vImage image_;
  dit::Mg2Visual visual_;
  std::unique_ptr<dit::Mg2NativeCache> native_;  // a native rollout's window (null otherwise)
};

// The pose after one more video frame of input, from `p` (see above); mode is the model's.
Pose mg2_integrate_pose(const Pose& p, const Mg2Input& in, const std::string& mode, double translation_scale,
                        double rotation_scale);

// The chunks whose frames upstream's rolling window holds while chunk `index` is made: the
// local_attn_size - frames_per_chunk latent frames before it, as chunk ids, oldest first.
std::vector<std::string> mg2_rolling_window_chunks(int64_t index, int local_attn_size, int frames_per_chunk);

}  // namespace wm::worldkv
