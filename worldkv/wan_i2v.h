#pragma once
// What the Wan image-to-video kinds of the session (Matrix-Game-2.0 in mg2_adapter.h,
// LingBot-World-Fast in lingbot_adapter.h) share: the image condition of each chunk, which both
// upstreams build alike (the mask and the VAE's latents of [image, zero frames], concatenated on
// the channels before the noise: in_dim 36 = 16 noise + 4 mask + 16 image latent), and the
// frames of the Wan VAE that decodes them.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "dit/codec.h"
#include "dit/image.h"

namespace wm::worldkv {

class WanI2vImage {
 public:
  // image_latents [N, channels, h, w] (any float dtype; kept float32 on `device`): the VAE's
  // encoding of [image, zeros x 4 (N - 1)]. Latent frames past N take the last one, which the
  // encoding of zero frames has converged to. Throws wm::Error on another shape.
  WanI2vImage(const at::Tensor& image_latents, int64_t channels, int64_t h, int64_t w, at::Device device);

  // The condition of latent frames first_frame .. first_frame + frames - 1: [frames, 4 + channels,
  // h, w] float32, mask (1 on all 4 channels of latent frame 0: upstream's mask repeats video
  // frame 0 four times; 0 elsewhere) then the image latents.
  at::Tensor condition(int64_t first_frame, int64_t frames) const;
  const at::Tensor& latents() const { return latents_; }

 private:
  at::Tensor latents_;
};

// A chunk's video frames from its latents through `codec` (continuing its stream), float32 in;
// empty without a codec.
std::vector<Image> wan_decode_frames(dit::Codec* codec, const at::Tensor& latents);

}  // namespace wm::worldkv
