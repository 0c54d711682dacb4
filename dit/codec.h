#pragma once
// Codecs between RGB frames and DiT latents. The tiny model uses a pixel-patch codec
// (space-to-depth by `stride`, values mapped to [-1, 1]); Matrix-Game-2.0 uses the Wan2.1 VAE
// (dit/wan_vae.h), whose decoder streams: each decode() continues the rollout of the previous
// ones (a causal feature cache), until reset().
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dit/config.h"
#include "dit/image.h"
#include "dit/wan_vae.h"

namespace wm::dit {

class Codec {
 public:
  virtual ~Codec() = default;

  // frames [F, H, W, 3] uint8 (any device) -> latents [encoded_latents(F), C, h, w] float32 on
  // `device`. Every call encodes a clip of its own (no state). Throws wm::Error on a wrong shape
  // or dtype, or a frame count the codec cannot encode (encoded_latents(F) == 0).
  virtual at::Tensor encode(const at::Tensor& frames, at::Device device) const = 0;
  // latents [F, C, h, w] (any float dtype / device) -> frames [decoded_frames(F), H, W, 3] uint8
  // on the CPU. A streaming codec continues the rollout that the calls since the last reset()
  // decoded. Throws wm::Error on a wrong shape.
  virtual at::Tensor decode(const at::Tensor& latents) = 0;
  // Starts a new rollout: forgets the decoder's streaming state (nothing for a stateless codec).
  virtual void reset() {}
  // Frames the next decode() of n latents gives (n for a stateless codec).
  virtual int64_t decoded_frames(int64_t n_latents) const { return n_latents; }
  // Latents that encode() gives for n frames; 0 when n frames are not a clip it can encode.
  virtual int64_t encoded_latents(int64_t n_frames) const { return n_frames; }

  virtual int latent_channels() const = 0;
  virtual int image_height() const = 0;
  virtual int image_width() const = 0;

  // The same over wm::Image lists (every image of the codec's size).
  at::Tensor encode_images(const std::vector<Image>& frames, at::Device device) const;
  std::vector<Image> decode_images(const at::Tensor& latents);
};

// Space-to-depth by s: pixel (y, x, c) of an H x W frame goes to latent channel c*s*s + (y%s)*s + x%s
// at (y/s, x/s) (at::pixel_unshuffle order), value v / 127.5 - 1. decode(encode(x)) == x exactly.
class PixelPatchCodec final : public Codec {
 public:
  PixelPatchCodec(int stride, int image_height, int image_width);
  at::Tensor encode(const at::Tensor& frames, at::Device device) const override;
  at::Tensor decode(const at::Tensor& latents) override;
  int latent_channels() const override { return 3 * s_ * s_; }
  int image_height() const override { return h_; }
  int image_width() const override { return w_; }

 private:
  int s_, h_, w_;
};

// Matrix-Game-2.0's codec: the Wan2.1 VAE (wan_vae.h), its encoder and its streaming decoder,
// each in its own dtype (Matrix-Game-2.0: bfloat16 and float16).
struct WanVaeCodecOptions {
  at::Device device = at::kCPU;                 // where both halves run
  at::ScalarType encode_dtype = at::kBFloat16;  // float32, bfloat16 or float16
  at::ScalarType decode_dtype = at::kHalf;
  int image_height = 352;  // frame size encode() takes and decode() gives (multiples of 8)
  int image_width = 640;
};

class WanVaeCodec final : public Codec {
 public:
  // From a Wan VAE state dict (names as in Wan2.1_VAE.pth; the config is read off the shapes).
  // Throws wm::Error naming `where` and the key for a missing, unexpected or mis-shaped tensor,
  // or on a bad option.
  WanVaeCodec(const std::map<std::string, at::Tensor>& state_dict, const WanVaeCodecOptions& opt,
              const std::string& where = "state dict");
  // The same from a .pth or .safetensors file; errors name the file.
  static std::unique_ptr<WanVaeCodec> from_file(const std::string& path, const WanVaeCodecOptions& opt);

  // frames [F, H, W, 3] uint8, F = 1 + 4k -> normalised latents [1 + k, 16, H/8, W/8] float32 on
  // `device`; pixels become (v / 255 - 0.5) / 0.5, as Matrix-Game-2.0's ToTensor + Normalize.
  at::Tensor encode(const at::Tensor& frames, at::Device device) const override;
  // video [F, 3, H, W] float in [-1, 1], F = 1 + 4k -> latents [1 + k, 16, H/8, W/8] float32 on
  // `device` (the encoder's output, in its dtype, widened).
  at::Tensor encode_video(const at::Tensor& video, at::Device device) const;
  // Matrix-Game-2.0's image condition: the encoding of [image, 4 (n_latents - 1) zero frames]
  // (zero = mid-grey in [-1, 1]); image [H, W, 3] uint8 -> [n_latents, 16, H/8, W/8] float32.
  at::Tensor encode_condition(const at::Tensor& image, int64_t n_latents, at::Device device) const;

  // latents [F, 16, H/8, W/8] (any float dtype / device) -> frames [F', H, W, 3] uint8 on the
  // CPU, F' = 1 + 4 (F - 1) for the first call of a rollout, 4 F after; ((v + 1) * 127.5)
  // clipped to [0, 255] and truncated, as Matrix-Game-2.0 writes its frames.
  at::Tensor decode(const at::Tensor& latents) override;
  // The same before the uint8 conversion: [F', 3, H, W] float32 in [-1, 1] on the CPU.
  at::Tensor decode_float(const at::Tensor& latents);
  void reset() override { state_.reset(); }
  int64_t decoded_frames(int64_t n_latents) const override { return state_.frames_for(n_latents); }
  int64_t encoded_latents(int64_t n_frames) const override;

  int latent_channels() const override { return 16; }
  int image_height() const override { return opt_.image_height; }
  int image_width() const override { return opt_.image_width; }

  const WanVaeCodecOptions& options() const { return opt_; }
  const WanVaeDecodeState& decode_state() const { return state_; }
  WanVae encoder_vae() const { return enc_; }  // encoder.*, conv1.*
  WanVae decoder_vae() const { return dec_; }  // decoder.*, conv2.*

 private:
  void check_frames(const at::Tensor& video, const char* what) const;
  WanVaeCodecOptions opt_;
  WanVae enc_{nullptr}, dec_{nullptr};
  WanVaeDecodeState state_;
};

// The codec a config names, its modules on `device`: "pixel_patch", or "wan_vae" from
// cfg.codec.weights in cfg.codec.dtype (see CodecConfig). Throws wm::Error for a kind this build
// does not provide, a "wan_vae" without weights, or a config that does not fit the VAE (16 latent
// channels, stride 8), and as WanVaeCodec::from_file.
std::unique_ptr<Codec> make_codec(const DitConfig& cfg, at::Device device = at::kCPU);

// Frames as a tensor [F, H, W, 3] uint8 (CPU) and back. Throws on mixed sizes.
at::Tensor images_to_tensor(const std::vector<Image>& frames);
std::vector<Image> tensor_to_images(const at::Tensor& frames);

}  // namespace wm::dit
