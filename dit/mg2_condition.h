#pragma once
// Matrix-Game-2.0's conditioning of a rollout from its first image, as inference.py builds it:
// the image cropped to 352:640 and resized (mg2_image.h); the Wan VAE's encoding of [image,
// 4 (N - 1) zero frames] (the channel-concatenated image latents); the CLIP tower's tokens of the
// image squashed to 224 x 224.
#include <ATen/ATen.h>

#include "dit/clip_vision.h"
#include "dit/codec.h"
#include "dit/image.h"

namespace wm::dit {

struct Mg2Condition {
  at::Tensor image_latents;  // [N, 16, 44, 80] float32
  at::Tensor clip_tokens;    // [257, 1280] float32
  Image image;               // the 640 x 352 frame both were made from
};

// Throws wm::Error on an empty image or n_latents < 1; whatever the VAE or CLIP throw.
Mg2Condition mg2_condition(const Image& image, const WanVaeCodec& vae, const ClipVision& clip, int64_t n_latents,
                           at::Device device);

}  // namespace wm::dit
