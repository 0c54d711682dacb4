#include "dit/mg2_condition.h"

#include <ATen/core/grad_mode.h>

#include "dit/mg2_image.h"
#include "runtime/error.h"

namespace wm::dit {

Mg2Condition mg2_condition(const Image& image, const WanVaeCodec& vae, const ClipVision& clip, int64_t n_latents,
                           at::Device device) {
  WM_CHECK(n_latents >= 1, "the condition needs at least one latent frame, got ", n_latents);
  at::NoGradGuard ng;
  Mg2Condition c;
  c.image = mg2_crop_resize(image);
  const at::Tensor pixels = images_to_tensor({c.image})[0];  // [352, 640, 3] uint8
  c.image_latents = vae.encode_condition(pixels, n_latents, device).to(at::kFloat);
  const at::Tensor clip_in = mg2_clip_input(mg2_normalize(c.image)).to(clip.device());
  c.clip_tokens = clip.forward(clip_in)[0].to(device, at::kFloat);
  return c;
}

}  // namespace wm::dit
