#pragma once
// LingBot-World-Fast's DiT: upstream WanModelFast (wan/modules/model_fast.py of
// Robbyant/lingbot-world, first generation), a causal Wan DiT driven by camera rays and text,
// streaming one chunk of latent frames at a time over cached K/V.
//
// Submodules mirror the checkpoint's Wan-native keys (no prefix):
//   patch_embedding (Conv3d in_dim -> dim, k = s = (1, 2, 2)), patch_embedding_wancamctrl
//   (Linear 1536 -> dim), c2ws_hidden_states_layer{1,2}, text_embedding.{0,2} (Linear, GELU tanh,
//   Linear), time_embedding.{0,2}, time_projection.1,
//   blocks.N.{self_attn.{q,k,v,o,norm_q,norm_k}, norm3, cross_attn.{q,k,v,o,norm_q,norm_k},
//   ffn.{0,2}, modulation, cam_injector_layer{1,2}, cam_scale_layer, cam_shift_layer},
//   head.{head, modulation}.
//
// Forward of one chunk (e0 = time_projection(e), one row per modulation group: upstream computes
// a row per token; tokens of equal timestep get equal rows, so one row per frame or per chunk is
// the same arithmetic):
//   c   = patch_embedding_wancamctrl(rays folded 2x2) ; c += layer2(silu(layer1(c)))
//   per block, m = modulation + e0 -> shift, scale, gate (attention), shift, scale, gate (FFN):
//   x += gate * self_attn(LN(x) * (1 + scale) + shift)   (3D RoPE, keys cached after rotation)
//   h  = cam_injector_layer2(silu(cam_injector_layer1(c))) + c
//   x  = (1 + cam_scale_layer(h)) * x + cam_shift_layer(h)
//   x += cross_attn(norm3(x), text)                      (text_len tokens, zero-padded, no mask)
//   x += gate * ffn(LN(x) * (1 + scale) + shift)
// head: LN(x) * (1 + scale) + shift with (shift, scale) = head.modulation + e, a linear to the
// patch and unpatchify. The output is the flow (noise - x0) at timestep t on the 0..1000 scale.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

#include "dit/lingbot_config.h"
#include "dit/wan_layers.h"
#include "runtime/block.h"
#include "runtime/kv_spec.h"

namespace wm::dit {

struct LingbotBlockImpl : torch::nn::Module {
  explicit LingbotBlockImpl(const LingbotConfig& c);
  WanAttention self_attn{nullptr};
  torch::nn::LayerNorm norm3{nullptr};  // affine (cross_attn_norm), eps = config eps
  WanAttention cross_attn{nullptr};
  torch::nn::Sequential ffn{nullptr};   // Linear, GELU(tanh), Linear
  at::Tensor modulation;                // [1, 6, dim]
  torch::nn::Linear cam_injector_layer1{nullptr}, cam_injector_layer2{nullptr};
  torch::nn::Linear cam_scale_layer{nullptr}, cam_shift_layer{nullptr};
};
TORCH_MODULE(LingbotBlock);

// What one chunk leaves behind in the cache (the clean pass's is what stays): per block k
// [heads, n, head_dim] rotated, v, positions [n, 3], log-weights zeros.
struct LingbotChunkKv {
  std::vector<LayerKv> main;
  int64_t n_tokens() const { return main.empty() ? 0 : main[0].n_tokens(); }
};

// Where a streamed model's blocks come from (LingbotDitImpl::stream_blocks): load(l, block) fills
// `block`, shaped as every block of the model, in its dtype and on its device, with block l's
// weights. Throws wm::Error when it cannot.
class LingbotBlockSource {
 public:
  virtual ~LingbotBlockSource() = default;
  virtual void load(int layer, LingbotBlockImpl& block) = 0;
};

// The text context's cross-attention K/V per block [1, heads, text_len, head_dim]; made once a prompt.
using LingbotText = WanCrossKv;

class LingbotDitImpl : public torch::nn::Module {
 public:
  // streamed: hold one block instead of num_layers (`blocks` then has one slot), which
  // stream_blocks' source refills before each block runs: the release's 40 blocks are 74 GB in
  // float32 and 37 in bfloat16, one block 1.9 / 0.9 GB.
  explicit LingbotDitImpl(LingbotConfig cfg, bool streamed = false);
  const LingbotConfig& config() const { return cfg_; }
  bool streamed() const { return streamed_; }
  // A streamed model's block source (lingbot_weights.h: lingbot_file_blocks). Throws wm::Error on
  // a model that is not streamed.
  void stream_blocks(std::shared_ptr<LingbotBlockSource> source);

  // The cross-attention K/V of a text context [L, text_dim] or [1, L, text_dim] (the umT5
  // encoder's output, L <= text_len): zero-padded to text_len, text_embedding, then each block's
  // k (with norm_k) and v. Throws wm::Error on a bad shape.
  LingbotText encode_text(const at::Tensor& context);

  // The camera embedding of folded rays cam [F, camera_channels, h, w] (lingbot_camera.h):
  // patch_embedding_wancamctrl of each 2x2 patch plus its c2ws_hidden_states MLP. [1, F*h*w/4, dim].
  at::Tensor embed_camera(const at::Tensor& cam);

  // The flow of one chunk. x [F, out_dim, h, w] noisy latents; t timesteps on the 0..1000 scale:
  // a scalar, [F] (per frame) or [F * h * w / 4] (per token); cond [F, in_dim - out_dim, h, w]
  // (mask 4 | image latent 16; undefined for t2v); cam [F, camera_channels, h, w] folded rays
  // (undefined: no camera injection, as upstream without c2ws_plucker_emb); first_frame: the
  // absolute latent frame of x[0] (RoPE); ctx what it attends to besides itself. kv_out (optional)
  // receives the chunk's K/V. Returns [F, out_dim, h, w] in x's dtype. Throws wm::Error on a shape
  // mismatch.
  at::Tensor forward_chunk(const at::Tensor& x, const at::Tensor& t, const at::Tensor& cond, const at::Tensor& cam,
                           const LingbotText& text, int64_t first_frame, const WanKvContext& ctx,
                           LingbotChunkKv* kv_out = nullptr);

  // The KV layout: num_layers x num_heads x head_dim, (t, h, w) RoPE as Wan.
  KvSpec kv_spec(at::Device device, at::ScalarType dtype = at::kFloat) const;
  at::ScalarType dtype() const { return patch_embedding->weight.scalar_type(); }
  at::Device device() const { return patch_embedding->weight.device(); }

  torch::nn::Conv3d patch_embedding{nullptr};
  torch::nn::Linear patch_embedding_wancamctrl{nullptr};
  torch::nn::Linear c2ws_hidden_states_layer1{nullptr}, c2ws_hidden_states_layer2{nullptr};
  torch::nn::Sequential text_embedding{nullptr}, time_embedding{nullptr}, time_projection{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  WanHead head{nullptr};

 private:
  // Block l: the model's own, or (streamed) the slot filled with block l's weights.
  LingbotBlockImpl& block(int l);

  LingbotConfig cfg_;
  RopeSpec rope_;
  bool streamed_ = false;
  std::shared_ptr<LingbotBlockSource> source_;
  int slot_layer_ = -1;  // the block the slot holds (-1: none yet)
};
TORCH_MODULE(LingbotDit);

}  // namespace wm::dit
