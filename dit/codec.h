#pragma once
// Codecs between RGB frames and DiT latents. The tiny model uses a pixel-patch codec
// (space-to-depth by `stride`, values mapped to [-1, 1]); a VAE can come later behind the same
// interface.
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "dit/config.h"
#include "dit/image.h"

namespace wm::dit {

class Codec {
 public:
  virtual ~Codec() = default;

  // frames [F, H, W, 3] uint8 (any device) -> latents [F, C, h, w] float32 on `device`.
  // Throws wm::Error on a wrong shape or dtype.
  virtual at::Tensor encode(const at::Tensor& frames, at::Device device) const = 0;
  // latents [F, C, h, w] (any float dtype / device) -> frames [F, H, W, 3] uint8 on the CPU.
  virtual at::Tensor decode(const at::Tensor& latents) const = 0;

  virtual int latent_channels() const = 0;
  virtual int image_height() const = 0;
  virtual int image_width() const = 0;

  // The same over wm::Image lists (every image of the codec's size).
  at::Tensor encode_images(const std::vector<Image>& frames, at::Device device) const;
  std::vector<Image> decode_images(const at::Tensor& latents) const;
};

// Space-to-depth by s: pixel (y, x, c) of an H x W frame goes to latent channel c*s*s + (y%s)*s + x%s
// at (y/s, x/s) (at::pixel_unshuffle order), value v / 127.5 - 1. decode(encode(x)) == x exactly.
class PixelPatchCodec final : public Codec {
 public:
  PixelPatchCodec(int stride, int image_height, int image_width);
  at::Tensor encode(const at::Tensor& frames, at::Device device) const override;
  at::Tensor decode(const at::Tensor& latents) const override;
  int latent_channels() const override { return 3 * s_ * s_; }
  int image_height() const override { return h_; }
  int image_width() const override { return w_; }

 private:
  int s_, h_, w_;
};

// The codec a config names. Throws wm::Error for a kind this build does not provide.
std::unique_ptr<Codec> make_codec(const DitConfig& cfg);

// Frames as a tensor [F, H, W, 3] uint8 (CPU) and back. Throws on mixed sizes.
at::Tensor images_to_tensor(const std::vector<Image>& frames);
std::vector<Image> tensor_to_images(const at::Tensor& frames);

}  // namespace wm::dit
