#pragma once
// A small per-frame convolutional autoencoder: the embedded world model's learned codec
// ("conv_ae" in a config's codec.kind). Trained by wm_train_codec on the procedural world's
// frames; frames [N, 3, H, W] in [-1, 1] <-> latents [N, C, H / s, W / s], s = 2^(levels - 1).
//
//   encoder  conv3x3 3 -> w0 | per level i < L: ResBlock(w_i), conv3x3 stride 2 w_i -> w_{i+1} |
//            ResBlock(w_L) | SiLU, conv1x1 w_L -> C
//   decoder  conv3x3 C -> w_L | ResBlock(w_L) | per level i = L..1: nearest x2,
//            conv3x3 w_i -> w_{i-1}, ResBlock(w_{i-1}) unless i - 1 = 0 | SiLU, conv3x3 w0 -> 3
//   ResBlock(w)  x + conv3x3(SiLU(conv3x3(SiLU(x))))
//
// No normalisation layers: a frame's latents do not depend on the other frames of a call.
// The codec's latents are the encoder's output standardised per channel by latent_mean and
// latent_std (measured on training frames), so that the DiT's noise and its latents have one
// scale. File layout (safetensors): tensors "codec.<module path>", "codec.latent_mean",
// "codec.latent_std", and metadata "codec_config" (JSON of ConvAeConfig); a DiT file may carry
// the same tensors beside its own (dit/weights.h).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dit/codec.h"

namespace wm::dit {

struct ConvAeConfig {
  int latent_channels = 8;
  std::vector<int> widths{32, 64, 96};  // channels per level, full resolution first
  int image_height = 64, image_width = 64;

  int stride() const { return 1 << (static_cast<int>(widths.size()) - 1); }
  // Throws wm::Error naming the field (no levels, a width or channel count < 1, a frame size not
  // divisible by the stride).
  void validate() const;
};

std::string conv_ae_config_json(const ConvAeConfig& c);
// Parses conv_ae_config_json's output; `where` prefixes errors.
ConvAeConfig conv_ae_config_from_json(const std::string& text, const std::string& where);

class ConvAeResBlockImpl : public torch::nn::Module {
 public:
  explicit ConvAeResBlockImpl(int width);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(ConvAeResBlock);

class ConvAeImpl : public torch::nn::Module {
 public:
  explicit ConvAeImpl(const ConvAeConfig& cfg);
  // [N, 3, H, W] float in [-1, 1] -> the encoder's output [N, C, H / s, W / s] (not standardised).
  at::Tensor encode_raw(const at::Tensor& x);
  // The encoder's output -> [N, 3, H, W] float (about [-1, 1], not clamped).
  at::Tensor decode_raw(const at::Tensor& z);
  // Standardised latents <-> the encoder's output.
  at::Tensor standardise(const at::Tensor& z) const;
  at::Tensor unstandardise(const at::Tensor& latents) const;
  // Seeded initialisation (PyTorch's default conv init, from a generator of this seed; the last
  // decoder conv scaled by 0.1).
  void init_weights(uint64_t seed);
  const ConvAeConfig& config() const { return cfg_; }

  torch::nn::Conv2d enc_in{nullptr}, enc_out{nullptr}, dec_in{nullptr}, dec_out{nullptr};
  torch::nn::ModuleList enc_blocks{nullptr}, enc_down{nullptr}, dec_blocks{nullptr}, dec_up{nullptr};
  ConvAeResBlock enc_mid{nullptr}, dec_mid{nullptr};
  at::Tensor latent_mean, latent_std;  // buffers [C]: 0 and 1 until measured

 private:
  ConvAeConfig cfg_;
};
TORCH_MODULE(ConvAe);

// Every parameter and the two statistics as named in a file ("codec." + module path), on the CPU.
std::vector<std::pair<std::string, at::Tensor>> conv_ae_tensors(ConvAeImpl& ae);
// Writes conv_ae_tensors and the config (metadata "codec_config") plus extra metadata, whole (a
// temporary name, then a rename). Throws wm::Error on an I/O failure.
void save_conv_ae(ConvAeImpl& ae, const std::string& path, const std::map<std::string, std::string>& extra_metadata = {});
// True when the file holds a conv_ae (its "codec_config" metadata).
bool has_conv_ae(const std::string& path);
// Builds the autoencoder a file describes and loads it (a conv_ae file, or a DiT file that
// carries one) on `device`. Throws wm::Error naming the file and the tensor for a missing,
// mis-shaped or non-finite tensor, or a file with no "codec_config".
ConvAe load_conv_ae(const std::string& path, at::Device device = at::kCPU);

// The Codec over a ConvAe: encode maps uint8 pixels to v / 127.5 - 1 and standardises the
// encoder's output; decode undoes both and rounds to uint8. Stateless (encode may be called
// from several threads at once); no autograd.
class ConvAeCodec final : public Codec {
 public:
  explicit ConvAeCodec(ConvAe ae, at::Device device = at::kCPU);
  static std::unique_ptr<ConvAeCodec> from_file(const std::string& path, at::Device device = at::kCPU);
  at::Tensor encode(const at::Tensor& frames, at::Device device) const override;
  at::Tensor decode(const at::Tensor& latents) override;
  int latent_channels() const override { return ae_->config().latent_channels; }
  int image_height() const override { return ae_->config().image_height; }
  int image_width() const override { return ae_->config().image_width; }
  int stride() const { return ae_->config().stride(); }
  ConvAe module() const { return ae_; }

 private:
  ConvAe ae_;
  at::Device device_;
};

// Frames [N, H, W, 3] uint8 -> [N, 3, H, W] float in [-1, 1] on `device`, and back (rounded,
// clamped; on the CPU).
at::Tensor frames_to_unit(const at::Tensor& frames, at::Device device);
at::Tensor unit_to_frames(const at::Tensor& x);

}  // namespace wm::dit
