#pragma once
// The Wan2.1 video VAE (Matrix-Game-2.0's codec), as its upstream code runs it: the causal 3D
// encoder fed one frame and then groups of 4 (each conv keeps a feature cache across the
// groups), and the streaming decoder that Matrix-Game-2.0 calls per generated chunk, one latent
// frame at a time, with a cache of 32 slots that lives across chunks.
//
// Layouts: videos [B, 3, T, H, W] in [-1, 1]; latents [B, z_dim, N, H/8, W/8] with
// T = 1 + 4 (N - 1). The decoder's chunk interface keeps the frame-major layout of upstream's
// VAEDecoderWrapper: latents [B, F, z_dim, h, w] in, frames [B, F', 3, 8h, 8w] float32 out.
//
// Modules and checkpoint keys (Wan2.1_VAE.pth, no prefix; base dim d = 96, dims
// [d, 2d, 4d, 4d] for dim_mult [1, 2, 4, 4]):
//   CausalConv3d    weight [out, in, kt, kh, kw], bias [out]; zero padding in space on both
//                   sides, in time 2 * pad_t frames in front only (or the cached frames instead)
//   RMS_norm        gamma [C, 1, 1, 1] ([C, 1, 1] in the attention block);
//                   x / max(||x||_2 over C, 1e-12) * sqrt(C) * gamma
//   ResidualBlock   residual.{0: RMS, 1: SiLU, 2: conv 3, 3: RMS, 4: SiLU, 5: Dropout, 6: conv 3},
//                   shortcut (1x1x1 conv, only when in != out); out = residual(x) + shortcut(x)
//   AttentionBlock  per frame, one head over the h*w positions: norm, to_qkv (Conv2d 1x1, C -> 3C,
//                   q | k | v channel thirds), softmax(q k^T / sqrt(C)) v, proj (Conv2d 1x1),
//                   plus the input
//   Resample        resample.{0: ZeroPad2d(0,1,0,1) or nearest x2 up, 1: Conv2d}, per frame:
//                   down: Conv2d(C, C, 3, stride 2) after padding right and bottom by one;
//                   up: nearest x2 (in float32, as upstream) then Conv2d(C, C/2, 3, pad 1);
//                   3d modes add time_conv: down CausalConv3d(C, C, (3,1,1), stride (2,1,1), no
//                   pad), up CausalConv3d(C, 2C, (3,1,1), pad (1,0,0)) whose two channel halves
//                   become frames 2i and 2i+1 (the frame count doubles)
//   encoder.conv1 (3 -> d), encoder.downsamples.{0..10} (Res, Res, down2d, Res, Res, down3d, Res,
//     Res, down3d, Res, Res for temporal_downsample [F, T, T]), encoder.middle.{0: Res, 1: Attn,
//     2: Res}, encoder.head.{0: RMS, 1: SiLU, 2: conv 3 (4d -> 2 z_dim)}
//   conv1 (1x1x1, 2 z_dim -> 2 z_dim): mu is its first z_dim channels
//   conv2 (1x1x1, z_dim -> z_dim), then decoder.conv1 (z_dim -> 4d), decoder.middle.{0,1,2},
//     decoder.upsamples.{0..14} (Res x3, up3d, Res x3, up3d, Res x3, up2d, Res x3; the first
//     Res after an up-sample takes half the channels), decoder.head.{0: RMS, 1: SiLU, 2: conv 3
//     (d -> 3)}
//
// Feature cache (one slot per temporal conv of kernel 3, in forward order; the decoder has 32,
// the encoder 24). For a conv over x with T frames: the conv sees [slot frames | x], zero frames
// making up for what the slot lacks (2 zeros when empty), and the slot becomes x's last 2 frames
// (the slot's last frame and x when x has one). The up3d time conv: its first visit marks the
// slot ('Rep') and skips the conv (no doubling: the first latent of a rollout gives 1 frame);
// the second runs it with zero padding and keeps [0, x]; later ones use the slot. The down3d
// time conv: the first visit keeps x and skips the conv; later ones convolve [slot's last | x]
// and keep x's last frame.
//
// Latent normalisation (the published per-channel mean and std of Wan2.1, float32):
//   encode  z = (mu - mean) * (1 / std);   decode  z' = z / (1 / std) + mean
// the constants cast to the module's dtype first, as upstream.
//
// Precision: the module computes in the dtype of its weights (float32, bfloat16 or float16),
// op by op as upstream. Upstream's islands: nearest up-sampling in float32 (exact either way),
// the decoder output cast to float32 before the clamp. On the CPU, where libtorch has no float16
// kernels for convolutions, matmuls and most element-wise ops, float16 is computed in float32
// and rounded to float16 after every op (what the GPU's float16 kernels do, accumulating in
// float32). Attention scores and softmax run in float32 for float16 and bfloat16.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace wm::dit {

struct WanVaeConfig {
  int64_t dim = 96;  // base width (Wan2.1: 96)
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult{1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temporal_downsample{false, true, true};  // decoder: reversed, as up-sampling

  // Throws wm::Error unless sizes are positive, dim_mult has >= 2 entries and
  // temporal_downsample has dim_mult.size() - 1.
  void validate() const;
  // The config of the VAE a state dict holds: dim from encoder.conv1.weight or
  // decoder.head.2.weight, z_dim from conv2.weight or conv1.weight; the rest as Wan2.1.
  // Throws wm::Error (naming `where`) if neither key of a pair is there.
  static WanVaeConfig from_state_dict(const std::map<std::string, at::Tensor>& sd,
                                      const std::string& where = "state dict");
};

// Which halves of the VAE a module holds.
enum class WanVaeParts {
  Full,     // encoder.*, conv1.*, conv2.*, decoder.*
  Encoder,  // encoder.*, conv1.*
  Decoder,  // decoder.*, conv2.* (what Matrix-Game-2.0 loads for its streaming decoder)
};

// Wan2.1's latent mean and std per channel, [16] float32.
at::Tensor wan_vae_mean();
at::Tensor wan_vae_std();

// One slot of the feature cache: empty (upstream's None), the up3d mark ('Rep'), or frames
// [B, C, 1 or 2, h, w] in the module's dtype.
struct VaeCacheSlot {
  at::Tensor x;
  bool rep = false;
  bool empty() const { return !rep && !x.defined(); }
};

// The slots of one pass (encode or one stream), indexed in forward order; grows as used.
struct VaeFeatCache {
  std::vector<VaeCacheSlot> slots;
  size_t idx = 0;  // the next slot of the current call (reset to 0 before each call)
  VaeCacheSlot& next();
};

// ---- building blocks (names mirror the checkpoint) ----

struct CausalConv3dImpl : torch::nn::Module {
  CausalConv3dImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride = {1, 1, 1},
                   std::vector<int64_t> padding = {0, 0, 0});
  // x [B, in, T, H, W] (the weights' dtype); cache: frames put in front instead of as many of the
  // 2 * pad_t zero frames (ignored when pad_t is 0). -> [B, out, T', H', W'].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cache = {});
  at::Tensor weight, bias;
  std::vector<int64_t> stride, padding;
};
TORCH_MODULE(CausalConv3d);

struct VaeConv2dImpl : torch::nn::Module {
  VaeConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding);
  at::Tensor forward(const at::Tensor& x);  // [N, in, H, W] -> [N, out, H', W']
  at::Tensor weight, bias;
  int64_t stride, padding;
};
TORCH_MODULE(VaeConv2d);

struct VaeRmsNormImpl : torch::nn::Module {
  // images: gamma [dim, 1, 1] for [N, C, H, W] inputs; else [dim, 1, 1, 1] for [B, C, T, H, W].
  VaeRmsNormImpl(int64_t dim, bool images);
  at::Tensor forward(const at::Tensor& x);  // normalised over dim 1; same shape and dtype
  at::Tensor gamma;
  double scale;
};
TORCH_MODULE(VaeRmsNorm);

struct VaeResidualBlockImpl : torch::nn::Module {
  VaeResidualBlockImpl(int64_t in, int64_t out);
  // x [B, in, T, H, W] -> [B, out, T, H, W]; cache null: no feature cache (plain causal convs).
  at::Tensor forward(const at::Tensor& x, VaeFeatCache* cache);
  torch::nn::ModuleList residual{nullptr};
  VaeRmsNorm norm1{nullptr}, norm2{nullptr};  // residual.0, residual.3
  CausalConv3d conv1{nullptr}, conv2{nullptr};  // residual.2, residual.6
  CausalConv3d shortcut{nullptr};             // null when in == out
};
TORCH_MODULE(VaeResidualBlock);

struct VaeAttentionBlockImpl : torch::nn::Module {
  explicit VaeAttentionBlockImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x);  // [B, C, T, H, W] -> same
  VaeRmsNorm norm{nullptr};
  VaeConv2d to_qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(VaeAttentionBlock);

enum class ResampleMode { Upsample2d, Upsample3d, Downsample2d, Downsample3d };

struct VaeResampleImpl : torch::nn::Module {
  VaeResampleImpl(int64_t dim, ResampleMode mode);
  // [B, C, T, H, W] -> up: [B, C/2, T or 2T, 2H, 2W]; down: [B, C, T or less, H', W'] with
  // H' = floor((H - 2) / 2) + 1 (pad 1 right/bottom, kernel 3, stride 2).
  at::Tensor forward(const at::Tensor& x, VaeFeatCache* cache);
  ResampleMode mode;
  torch::nn::ModuleList resample{nullptr};  // 0: (no parameters), 1: conv
  VaeConv2d conv{nullptr};                  // resample.1
  CausalConv3d time_conv{nullptr};          // 3d modes only
};
TORCH_MODULE(VaeResample);

struct VaeEncoder3dImpl : torch::nn::Module {
  // Outputs 2 * z_dim channels (mu | log_var before the top-level conv1).
  explicit VaeEncoder3dImpl(const WanVaeConfig& c);
  at::Tensor forward(const at::Tensor& x, VaeFeatCache* cache);
  CausalConv3d conv1{nullptr};
  torch::nn::ModuleList downsamples{nullptr}, middle{nullptr}, head{nullptr};
  VaeRmsNorm head_norm{nullptr};
  CausalConv3d head_conv{nullptr};
  std::vector<VaeResidualBlock> down_res;  // per downsamples index: a block or null
  std::vector<VaeResample> down_resample;  // per downsamples index: a resample or null
  VaeResidualBlock mid0{nullptr}, mid2{nullptr};
  VaeAttentionBlock mid1{nullptr};
};
TORCH_MODULE(VaeEncoder3d);

struct VaeDecoder3dImpl : torch::nn::Module {
  explicit VaeDecoder3dImpl(const WanVaeConfig& c);
  at::Tensor forward(const at::Tensor& x, VaeFeatCache* cache);
  CausalConv3d conv1{nullptr};
  torch::nn::ModuleList middle{nullptr}, upsamples{nullptr}, head{nullptr};
  VaeRmsNorm head_norm{nullptr};
  CausalConv3d head_conv{nullptr};
  std::vector<VaeResidualBlock> up_res;
  std::vector<VaeResample> up_resample;
  VaeResidualBlock mid0{nullptr}, mid2{nullptr};
  VaeAttentionBlock mid1{nullptr};
};
TORCH_MODULE(VaeDecoder3d);

// The streaming decoder's state: the feature cache kept across chunks of one rollout.
class WanVaeDecodeState {
 public:
  // Forgets everything: the next chunk starts a rollout (its first latent gives 1 frame).
  void reset();
  // Latent frames decoded since the last reset.
  int64_t latents_decoded() const { return latents_; }
  // Frames that decoding n more latents gives: 1 + 4 (n - 1) at the start of a rollout, else 4 n.
  int64_t frames_for(int64_t n) const;
  // The cache slots (upstream's list of 32 for the Wan2.1 decoder, after the first latent).
  const std::vector<VaeCacheSlot>& slots() const { return cache_.slots; }

 private:
  friend struct WanVaeImpl;
  VaeFeatCache cache_;
  int64_t latents_ = 0;
};

struct WanVaeImpl : torch::nn::Module {
  // The modules of `parts`; the convolution weights are uninitialised until load() (RMS gammas 1,
  // biases 0). Throws wm::Error on an invalid config.
  explicit WanVaeImpl(const WanVaeConfig& cfg = {}, WanVaeParts parts = WanVaeParts::Full);

  // video [B, 3, T, H, W] in [-1, 1] (any float dtype; cast to the weights' dtype), T = 1 + 4k,
  // H and W multiples of 8 -> normalised mu [B, z_dim, 1 + k, H/8, W/8] in the weights' dtype.
  // Upstream's VideoVAE_.encode with a fresh cache: frame 0 alone, then groups of 4. Throws
  // wm::Error on a bad shape or when the module has no encoder.
  at::Tensor encode(const at::Tensor& video);

  // One chunk of the stream, as upstream's VAEDecoderWrapper.forward(z, *cache): latents
  // [B, F, z_dim, h, w] normalised (any float dtype; cast to the weights' dtype) -> frames
  // [B, F', 3, 8h, 8w] float32 in [-1, 1], F' = state.frames_for(F). conv2 runs over all F
  // latents, then the decoder one latent at a time. Throws wm::Error on a bad shape or when the
  // module has no decoder; the state is unchanged on a shape error.
  at::Tensor decode_chunk(const at::Tensor& latents, WanVaeDecodeState& state);

  // The state dict's names and shapes this module expects, sorted by name.
  std::map<std::string, std::vector<int64_t>> expected_keys() const;

  // Copies a state dict into the module (each tensor converted to the parameter's dtype and
  // device). Strict: throws wm::Error naming the key (and `where`, e.g. the file) for a key the
  // module lacks ("missing"), a key it does not have ("unexpected") or a shape mismatch (both
  // shapes). The module is unchanged on error.
  void load(const std::map<std::string, at::Tensor>& sd, const std::string& where = "state dict");

  const WanVaeConfig& config() const { return cfg_; }
  WanVaeParts parts() const { return parts_; }
  at::ScalarType dtype() const;  // of the weights
  at::Device device() const;

  VaeEncoder3d encoder{nullptr};
  CausalConv3d conv1{nullptr};
  CausalConv3d conv2{nullptr};
  VaeDecoder3d decoder{nullptr};

 private:
  WanVaeConfig cfg_;
  WanVaeParts parts_;
};
TORCH_MODULE(WanVae);

// The entries of a full VAE state dict that a module of `parts` takes: Decoder, those whose
// name contains "decoder." or "conv2" (as Matrix-Game-2.0's inference.py selects them);
// Encoder, those starting with "encoder." or "conv1."; Full, all.
std::map<std::string, at::Tensor> wan_vae_select(const std::map<std::string, at::Tensor>& sd, WanVaeParts parts);

// Builds a VAE of `parts` from a state dict (config inferred, entries selected as above, loaded
// strictly), in `dtype` on `device`. Throws as WanVaeImpl::load, naming `where`.
WanVae make_wan_vae(const std::map<std::string, at::Tensor>& sd, WanVaeParts parts, at::ScalarType dtype,
                    at::Device device, const std::string& where = "state dict");
// The same from a file, .pth (torch.save zip) or .safetensors by content (runtime/pth.h);
// errors name the file.
WanVae load_wan_vae(const std::string& path, WanVaeParts parts, at::ScalarType dtype, at::Device device);

// Frames in [-1, 1] (any layout, float) -> uint8 as Matrix-Game-2.0 writes them:
// ((v + 1) * 127.5).clip(0, 255) in float32, then truncation to uint8.
at::Tensor wan_vae_to_uint8(const at::Tensor& frames);

}  // namespace wm::dit
