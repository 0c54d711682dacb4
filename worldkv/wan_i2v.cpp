#include "worldkv/wan_i2v.h"

#include "runtime/error.h"

namespace wm::worldkv {

WanI2vImage::WanI2vImage(const at::Tensor& image_latents, int64_t channels, int64_t h, int64_t w,
                         at::Device device) {
  WM_CHECK(image_latents.defined() && image_latents.dim() == 4 && image_latents.size(0) >= 1 &&
               image_latents.size(1) == channels && image_latents.size(2) == h && image_latents.size(3) == w,
           "image latents must be [N, ", channels, ", ", h, ", ", w, "], got ",
           image_latents.defined() ? image_latents.sizes() : at::IntArrayRef{});
  latents_ = image_latents.to(device, at::kFloat);
}

at::Tensor WanI2vImage::condition(int64_t first_frame, int64_t frames) const {
  WM_CHECK(first_frame >= 0 && frames > 0, "bad latent frames ", first_frame, " + ", frames);
  const int64_t N = latents_.size(0);
  at::Tensor idx = at::arange(first_frame, first_frame + frames, at::TensorOptions().dtype(at::kLong))
                       .clamp_max(N - 1)
                       .to(latents_.device());
  at::Tensor img = latents_.index_select(0, idx);
  at::Tensor mask = at::zeros({frames, 4, latents_.size(2), latents_.size(3)}, img.options());
  if (first_frame == 0) mask[0].fill_(1.0);
  return at::cat({mask, img}, 1);
}

std::vector<Image> wan_decode_frames(dit::Codec* codec, const at::Tensor& latents) {
  if (!codec) return {};
  return codec->decode_images(latents.to(at::kFloat));
}

}  // namespace wm::worldkv
