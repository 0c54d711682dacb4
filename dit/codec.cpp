#include "dit/codec.h"

#include <cstring>

#include "runtime/error.h"

namespace wm::dit {

at::Tensor images_to_tensor(const std::vector<Image>& frames) {
  WM_CHECK(!frames.empty(), "no frames");
  const int H = frames[0].height, W = frames[0].width;
  at::Tensor out = at::empty({int64_t(frames.size()), H, W, 3}, at::TensorOptions().dtype(at::kByte));
  for (size_t i = 0; i < frames.size(); ++i) {
    const Image& im = frames[i];
    WM_CHECK(im.width == W && im.height == H && im.rgb.size() == size_t(W) * H * 3, "frame ", i, " is ", im.width,
             "x", im.height, ", frame 0 is ", W, "x", H);
    std::memcpy(out[i].data_ptr<uint8_t>(), im.rgb.data(), im.rgb.size());
  }
  return out;
}

std::vector<Image> tensor_to_images(const at::Tensor& frames) {
  WM_CHECK(frames.dim() == 4 && frames.size(3) == 3 && frames.scalar_type() == at::kByte,
           "frames must be [F, H, W, 3] uint8, got ", frames.sizes(), " ", frames.scalar_type());
  at::Tensor f = frames.to(at::kCPU).contiguous();
  std::vector<Image> out;
  for (int64_t i = 0; i < f.size(0); ++i) {
    Image im(int(f.size(2)), int(f.size(1)));
    std::memcpy(im.rgb.data(), f[i].data_ptr<uint8_t>(), im.rgb.size());
    out.push_back(std::move(im));
  }
  return out;
}

at::Tensor Codec::encode_images(const std::vector<Image>& frames, at::Device device) const {
  return encode(images_to_tensor(frames), device);
}

std::vector<Image> Codec::decode_images(const at::Tensor& latents) const { return tensor_to_images(decode(latents)); }

PixelPatchCodec::PixelPatchCodec(int stride, int image_height, int image_width)
    : s_(stride), h_(image_height), w_(image_width) {
  WM_CHECK(s_ > 0 && h_ > 0 && w_ > 0 && h_ % s_ == 0 && w_ % s_ == 0, "image ", h_, "x", w_,
           " is not divisible by stride ", s_);
}

at::Tensor PixelPatchCodec::encode(const at::Tensor& frames, at::Device device) const {
  WM_CHECK(frames.dim() == 4 && frames.size(1) == h_ && frames.size(2) == w_ && frames.size(3) == 3 &&
               frames.scalar_type() == at::kByte,
           "frames must be [F, ", h_, ", ", w_, ", 3] uint8, got ", frames.sizes(), " ", frames.scalar_type());
  at::Tensor x = frames.to(device).permute({0, 3, 1, 2}).to(at::kFloat).div_(127.5).sub_(1.0);  // [F, 3, H, W]
  return at::pixel_unshuffle(x, s_).contiguous();
}

at::Tensor PixelPatchCodec::decode(const at::Tensor& latents) const {
  WM_CHECK(latents.dim() == 4 && latents.size(1) == latent_channels() && latents.size(2) * s_ == h_ &&
               latents.size(3) * s_ == w_,
           "latents must be [F, ", latent_channels(), ", ", h_ / s_, ", ", w_ / s_, "], got ", latents.sizes());
  at::Tensor x = at::pixel_shuffle(latents.to(at::kFloat), s_);  // [F, 3, H, W]
  x = x.add(1.0).mul_(127.5).round_().clamp_(0, 255).to(at::kByte);
  return x.permute({0, 2, 3, 1}).contiguous().to(at::kCPU);
}

std::unique_ptr<Codec> make_codec(const DitConfig& cfg) {
  if (cfg.codec.kind == "pixel_patch")
    return std::make_unique<PixelPatchCodec>(cfg.codec.stride, cfg.codec.image_height, cfg.codec.image_width);
  throw Error(str_cat("make_codec: codec kind '", cfg.codec.kind, "' of config '", cfg.name,
                      "' is not available in this build (only 'pixel_patch')"));
}

}  // namespace wm::dit
