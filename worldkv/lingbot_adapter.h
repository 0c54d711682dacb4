#pragma once
// LingBot-World-Fast (dit/lingbot_model.h) as a model kind of the session (worldkv/session.h):
// the DiT generating chunks of 3 latent frames (9 video frames for the first chunk, 12 after)
// driven by the camera pose of every video frame and a text context, conditioned on its first
// image (the Wan VAE's latents of [image, zero frames] and the mask, worldkv/wan_i2v.h), sampled
// by upstream's Fast schedule (dit/lingbot_sampler.h: 4 steps, then the clean t = 0 pass whose
// K/V stay), decoded by the Wan VAE when a codec is given. It runs over the world memory's
// window under any video policy, or over upstream's own rolling cache with its sink ("native",
// LingbotNativeCache of the config's local_attn_size and sink_size).
//
// The camera input. Latent frame j takes video frame 4j's pose, as the session's latent poses
// are. Two sources, as dit/README.md explains:
//   - a known trajectory (LingbotOptions::trajectory: every video frame's camera-to-world
//     matrix, given before the first chunk, as upstream reads poses.npy): upstream's offline
//     input exactly (interpolated to the latent frames, relative poses, translations divided by
//     the whole trajectory's largest step); the controls' poses then serve retrieval only;
//   - a live trajectory (the default): the controls' poses, turned into OpenCV camera-to-world
//     matrices (worldkv/pose.h), pushed a chunk at a time through LingbotLiveCamera with a fixed
//     translation scale or the running maximum.
// No chunk state travels with the K/V: the camera and the text enter through the tokens, whose
// K/V the memory moves as any model's.
#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dit/codec.h"
#include "dit/lingbot_camera.h"
#include "dit/lingbot_model.h"
#include "dit/lingbot_sampler.h"
#include "worldkv/model_adapter.h"
#include "worldkv/wan_i2v.h"

namespace wm::worldkv {

// Intrinsics (fx, fy, cx, cy) for a 480 x 832 image of upstream's example 00 (intrinsics.npy,
// rounded): a horizontal field of view of about 79 degrees.
inline constexpr std::array<double, 4> kLingbotIntrinsics{503.0, 503.0, 416.0, 240.0};

struct LingbotOptions {
  std::vector<int> step_indices;  // scheduler indices of the steps (empty: upstream's 0, 179, 358, 679)
  double shift = 10.0;            // the schedule's shift (upstream's sample_shift of the 14B config)
  std::array<double, 4> intrinsics = kLingbotIntrinsics;  // for a 480 x 832 image, scaled to the video
  // A known trajectory: c2ws [N, 4, 4] (OpenCV, any float dtype), one a video frame from frame 0.
  // Undefined: the live path.
  at::Tensor trajectory;
  double translation_scale = 0;   // live path: a fixed scale (> 0) or the running maximum (0)
  int64_t latent_height = 0, latent_width = 0;  // t2v models only (i2v: the image latents' size)
};

class LingbotAdapter final : public ModelAdapter {
 public:
  // text_context [L, text_dim] (umT5's output for the prompt, L <= text_len; undefined: no prompt,
  // text_len zero rows, which is not what an empty prompt encodes to); image_latents
  // [N, 16, h, w] for an i2v model (worldkv/wan_i2v.h), undefined for t2v. codec may be null
  // (latents only). Throws wm::Error on a wrong shape, schedule or trajectory.
  LingbotAdapter(dit::LingbotDit model, std::unique_ptr<dit::Codec> codec, const at::Tensor& text_context,
                 const at::Tensor& image_latents, LingbotOptions options, at::Device device);

  const ModelInfo& info() const override { return info_; }
  KvSpec kv_spec() const override { return model_->kv_spec(device_, model_->dtype()); }
  void check_controls(const std::vector<FrameControl>& controls) const override;
  Pose next_pose(const Pose& previous, const FrameControl& control) const override;
  void reset(bool native) override;
  SampledChunk sample(const ChunkStep& step) override;
  std::vector<Image> decode(const at::Tensor& latents) override { return wan_decode_frames(codec_.get(), latents); }
  size_t native_window_bytes() const override;
  std::vector<std::string> native_window_chunks(int64_t index) const override;

  const dit::LingbotDit& model() const { return model_; }
  // Latent frames the known trajectory covers (0 on the live path).
  int64_t trajectory_latents() const { return known_rel_.defined() ? known_rel_.size(0) : 0; }
  // The camera input of the chunk at latent frames first .. first + F - 1: [F, 384, h, w].
  at::Tensor camera_input(const ChunkStep& step);

 private:
  dit::LingbotDit model_;
  std::unique_ptr<dit::Codec> codec_;
  LingbotOptions opt_;
  at::Device device_;
  int64_t lat_h_ = 0, lat_w_ = 0;
  ModelInfo info_;
  dit::LingbotSchedule schedule_;
  dit::LingbotText text_;
  std::optional<WanI2vImage> image_;                // i2v only
  at::Tensor intrinsics_;                           // [4] for 480 x 832
  at::Tensor known_rel_;                            // known trajectory: normalised relative poses [n, 4, 4]
  std::unique_ptr<dit::LingbotLiveCamera> live_;    // live path
  std::unique_ptr<dit::LingbotNativeCache> native_; // a native rollout's cache (null otherwise)
};

// c2ws [n, 4, 4] float32 of poses (worldkv/pose.h's OpenCV matrices).
at::Tensor lingbot_c2ws(const std::vector<Pose>& poses);

// The chunks whose frames upstream's rolling cache (local_attn_size frames counting the chunk,
// the first sink_size kept) holds while chunk `index` is made, oldest first.
std::vector<std::string> lingbot_native_window_chunks(int64_t index, int local_attn_size, int sink_size,
                                                      int frames_per_chunk);

}  // namespace wm::worldkv
