#include "dit/codec.h"

#include <cstring>

#include "dit/conv_ae.h"
#include "runtime/error.h"
#include "runtime/pth.h"

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

std::vector<Image> Codec::decode_images(const at::Tensor& latents) { return tensor_to_images(decode(latents)); }

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

at::Tensor PixelPatchCodec::decode(const at::Tensor& latents) {
  WM_CHECK(latents.dim() == 4 && latents.size(1) == latent_channels() && latents.size(2) * s_ == h_ &&
               latents.size(3) * s_ == w_,
           "latents must be [F, ", latent_channels(), ", ", h_ / s_, ", ", w_ / s_, "], got ", latents.sizes());
  at::Tensor x = at::pixel_shuffle(latents.to(at::kFloat), s_);  // [F, 3, H, W]
  x = x.add(1.0).mul_(127.5).round_().clamp_(0, 255).to(at::kByte);
  return x.permute({0, 2, 3, 1}).contiguous().to(at::kCPU);
}

// ---- WanVaeCodec ----

WanVaeCodec::WanVaeCodec(const std::map<std::string, at::Tensor>& state_dict, const WanVaeCodecOptions& opt,
                         const std::string& where)
    : opt_(opt) {
  WM_CHECK(opt_.image_height > 0 && opt_.image_width > 0 && opt_.image_height % 8 == 0 && opt_.image_width % 8 == 0,
           "the Wan VAE's frames must be multiples of 8 in both sides, got ", opt_.image_height, "x",
           opt_.image_width);
  enc_ = make_wan_vae(state_dict, WanVaeParts::Encoder, opt_.encode_dtype, opt_.device, where);
  dec_ = make_wan_vae(state_dict, WanVaeParts::Decoder, opt_.decode_dtype, opt_.device, where);
  WM_CHECK(enc_->config().z_dim == 16 && dec_->config().z_dim == 16, where, ": the Wan VAE has 16 latent channels, got ",
           dec_->config().z_dim);
}

std::unique_ptr<WanVaeCodec> WanVaeCodec::from_file(const std::string& path, const WanVaeCodecOptions& opt) {
  return std::make_unique<WanVaeCodec>(load_state_dict(path), opt, path);
}

int64_t WanVaeCodec::encoded_latents(int64_t n_frames) const {
  return n_frames >= 1 && (n_frames - 1) % 4 == 0 ? 1 + (n_frames - 1) / 4 : 0;
}

void WanVaeCodec::check_frames(const at::Tensor& video, const char* what) const {
  WM_CHECK(video.dim() == 4 && encoded_latents(video.size(0)) > 0, what, " must be 1 + 4k frames, got ",
           video.sizes());
}

at::Tensor WanVaeCodec::encode(const at::Tensor& frames, at::Device device) const {
  WM_CHECK(frames.dim() == 4 && frames.size(1) == opt_.image_height && frames.size(2) == opt_.image_width &&
               frames.size(3) == 3 && frames.scalar_type() == at::kByte,
           "frames must be [F, ", opt_.image_height, ", ", opt_.image_width, ", 3] uint8, got ", frames.sizes(), " ",
           frames.scalar_type());
  check_frames(frames, "frames");
  // ToTensor + Normalize(0.5, 0.5): (v / 255 - 0.5) / 0.5 in float32
  at::Tensor v = frames.to(opt_.device).permute({0, 3, 1, 2}).to(at::kFloat).div_(255.0).sub_(0.5).div_(0.5);
  return encode_video(v, device);
}

at::Tensor WanVaeCodec::encode_video(const at::Tensor& video, at::Device device) const {
  WM_CHECK(video.dim() == 4 && video.size(1) == 3 && video.size(2) == opt_.image_height &&
               video.size(3) == opt_.image_width && video.is_floating_point(),
           "video must be [F, 3, ", opt_.image_height, ", ", opt_.image_width, "] float, got ", video.sizes(), " ",
           video.scalar_type());
  check_frames(video, "video");
  at::Tensor mu = enc_.ptr()->encode(video.permute({1, 0, 2, 3}).unsqueeze(0));  // [1, 16, N, h, w]
  return mu[0].permute({1, 0, 2, 3}).to(device, at::kFloat).contiguous();
}

at::Tensor WanVaeCodec::encode_condition(const at::Tensor& image, int64_t n_latents, at::Device device) const {
  WM_CHECK(image.dim() == 3 && image.size(0) == opt_.image_height && image.size(1) == opt_.image_width &&
               image.size(2) == 3 && image.scalar_type() == at::kByte,
           "image must be [", opt_.image_height, ", ", opt_.image_width, ", 3] uint8, got ", image.sizes(), " ",
           image.scalar_type());
  WM_CHECK(n_latents >= 1, "n_latents must be >= 1, got ", n_latents);
  at::Tensor v = image.to(opt_.device).permute({2, 0, 1}).to(at::kFloat).div_(255.0).sub_(0.5).div_(0.5);
  at::Tensor video = at::zeros({1 + 4 * (n_latents - 1), 3, opt_.image_height, opt_.image_width}, v.options());
  video[0].copy_(v);
  return encode_video(video, device);
}

at::Tensor WanVaeCodec::decode_float(const at::Tensor& latents) {
  WM_CHECK(latents.dim() == 4 && latents.size(0) >= 1 && latents.size(1) == 16 &&
               latents.size(2) * 8 == opt_.image_height && latents.size(3) * 8 == opt_.image_width,
           "latents must be [F, 16, ", opt_.image_height / 8, ", ", opt_.image_width / 8, "], got ", latents.sizes());
  at::Tensor out = dec_->decode_chunk(latents.unsqueeze(0), state_);  // [1, F', 3, H, W] float32
  return out[0].to(at::kCPU);
}

at::Tensor WanVaeCodec::decode(const at::Tensor& latents) {
  return wan_vae_to_uint8(decode_float(latents).permute({0, 2, 3, 1})).contiguous();
}

std::unique_ptr<Codec> make_codec(const DitConfig& cfg, at::Device device) {
  if (cfg.codec.kind == "pixel_patch")
    return std::make_unique<PixelPatchCodec>(cfg.codec.stride, cfg.codec.image_height, cfg.codec.image_width);
  if (cfg.codec.kind == "wan_vae") {
    const std::string w = str_cat("make_codec: config '", cfg.name, "': codec 'wan_vae'");
    if (cfg.codec.weights.empty())
      throw Error(str_cat(w, " needs its weights: set codec.weights to Wan2.1_VAE.pth (or a .safetensors of it)"));
    if (cfg.latent_channels != 16 || cfg.codec.stride != 8)
      throw Error(str_cat(w, " has 16 latent channels and stride 8, the config says ", cfg.latent_channels,
                          " and ", cfg.codec.stride));
    WanVaeCodecOptions opt;
    opt.device = device;
    opt.image_height = cfg.codec.image_height;
    opt.image_width = cfg.codec.image_width;
    if (!cfg.codec.dtype.empty()) {
      const std::string& d = cfg.codec.dtype;
      const at::ScalarType t = d == "float32" ? at::kFloat : d == "bfloat16" ? at::kBFloat16 : d == "float16" ? at::kHalf
                                                                                                           : at::kByte;
      if (t == at::kByte) throw Error(str_cat(w, ": dtype must be float32, bfloat16 or float16, got '", d, "'"));
      opt.encode_dtype = opt.decode_dtype = t;
    }
    return WanVaeCodec::from_file(cfg.codec.weights, opt);
  }
  if (cfg.codec.kind == "conv_ae") {
    const std::string w = str_cat("make_codec: config '", cfg.name, "': codec 'conv_ae'");
    if (cfg.codec.weights.empty())
      throw Error(str_cat(w, " needs its weights: set codec.weights to a wm_train_codec output"));
    auto codec = ConvAeCodec::from_file(cfg.codec.weights, device);
    if (codec->latent_channels() != cfg.latent_channels || codec->stride() != cfg.codec.stride ||
        codec->image_height() != cfg.codec.image_height || codec->image_width() != cfg.codec.image_width)
      throw Error(str_cat(w, ": ", cfg.codec.weights, " has ", codec->latent_channels(), " latent channels, stride ",
                          codec->stride(), ", frames ", codec->image_height(), "x", codec->image_width(),
                          "; the config says ", cfg.latent_channels, ", ", cfg.codec.stride, ", ",
                          cfg.codec.image_height, "x", cfg.codec.image_width));
    return codec;
  }
  throw Error(str_cat("make_codec: codec kind '", cfg.codec.kind, "' of config '", cfg.name,
                      "' is not available in this build (only 'pixel_patch', 'wan_vae' and 'conv_ae')"));
}

}  // namespace wm::dit
