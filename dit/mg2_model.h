#pragma once
// Matrix-Game-2.0's DiT: the i2v CausalWanModel of the upstream code, with its keyboard/mouse
// ActionModule, streaming one chunk of latent frames at a time over cached K/V.
//
// Submodules mirror the checkpoint's keys (the hub's files add a `model.` prefix):
//   patch_embedding (Conv3d in_dim -> dim, k = s = (1, 2, 2)), time_embedding.{0,2},
//   time_projection.1, img_emb.proj.{0,1,3,4} (LayerNorm, Linear, GELU erf, Linear, LayerNorm),
//   blocks.N.{self_attn.{q,k,v,o,norm_q,norm_k}, norm3, cross_attn.{q,k,v,o,norm_q,norm_k},
//   action_model.* (blocks of action_config.blocks, see mg2_action.h), ffn.{0,2}, modulation},
//   head.{head, modulation}.
//
// Per block (all per latent frame; e0 = time_projection(e) [F, 6, dim]):
//   m = modulation + e0 -> shift, scale, gate (attention), shift, scale, gate (FFN)
//   x += gate * self_attn(LN(x) * (1 + scale) + shift)   (3D RoPE, keys cached after rotation)
//   x += cross_attn(norm3(x), img_emb(CLIP tokens))      (K/V of the tokens computed once)
//   x  = action_model(x, keyboard, mouse)                (action blocks only)
//   x += gate * ffn(LN(x) * (1 + scale) + shift)
// head: LN(x) * (1 + scale) + shift with (shift, scale) = head.modulation + e (not e0), then a
// linear to the patch and unpatchify. The output is the flow (v = noise - x0) at timestep t on
// upstream's 0..1000 scale.
//
// Precision: the module computes in its weights' dtype. In float32 it matches upstream's fp32
// run (the conformance tests); in bfloat16 it keeps upstream's islands: LayerNorm statistics,
// the RMSNorm's normalisation (then the weight multiplied in bf16), RoPE in float32 (upstream
// float64), the sinusoid in float64 cast straight to bf16.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "dit/mg2_action.h"
#include "dit/mg2_config.h"
#include "dit/wan_layers.h"
#include "runtime/block.h"
#include "runtime/kv_spec.h"
#include "runtime/window.h"

namespace wm::dit {

// The shared Wan modules (wan_layers.h) under the names this model has always used.
using Mg2RmsNormImpl = WanRmsNormImpl;
using Mg2RmsNorm = WanRmsNorm;
using Mg2AttentionImpl = WanAttentionImpl;
using Mg2Attention = WanAttention;

struct Mg2BlockImpl : torch::nn::Module {
  Mg2BlockImpl(const Mg2Config& c, int index);
  Mg2Attention self_attn{nullptr};
  torch::nn::LayerNorm norm3{nullptr};  // affine, eps = config eps
  Mg2Attention cross_attn{nullptr};
  Mg2ActionModule action_model{nullptr};  // null outside action_config.blocks
  torch::nn::Sequential ffn{nullptr};     // Linear, GELU(tanh), Linear
  at::Tensor modulation;                  // [1, 6, dim]
};
TORCH_MODULE(Mg2Block);

struct Mg2ImgEmbImpl : torch::nn::Module {
  explicit Mg2ImgEmbImpl(const Mg2Config& c);
  torch::nn::Sequential proj{nullptr};  // LayerNorm(1280), Linear, GELU, Linear, LayerNorm(dim); eps 1e-5
};
TORCH_MODULE(Mg2ImgEmb);

// What one chunk leaves behind in the caches (the refresh pass's is what stays).
struct Mg2ChunkKv {
  std::vector<LayerKv> main;  // per block: k [heads, n, head_dim] rotated, v, pos [n, 3], logw zeros
  ActionKv action;            // per action block (mg2_action.h)

  int64_t n_tokens() const { return main.empty() ? 0 : main[0].n_tokens(); }
};

// What a chunk attends to besides itself: the main K/V either from a window (staged into, the
// window unchanged) or given per block, and the action modules' K/V of the same frames.
struct Mg2Context {
  KvWindow* window = nullptr;
  const std::vector<LayerKv>* main = nullptr;  // when window is null: per block [heads, n_ctx, head_dim]
  const ActionKv* action = nullptr;            // per action block; null: no action context
};

// The CLIP tokens' cross-attention K/V, per block [1, heads, 257, head_dim]; made once a rollout.
using Mg2Visual = WanCrossKv;

class Mg2DitImpl : public torch::nn::Module {
 public:
  explicit Mg2DitImpl(Mg2Config cfg);
  const Mg2Config& config() const { return cfg_; }

  // The cross-attention K/V of CLIP tokens [257, 1280] or [1, 257, 1280] (img_emb, then each
  // block's k/v with norm_k).
  Mg2Visual encode_visual(const at::Tensor& clip_tokens);

  // The flow of one chunk. x [F, 16, 44, 80] noisy latents; t [F] (or a scalar) timesteps on the
  // 0..1000 scale; cond [F, 20, 44, 80] (mask 4 | image latent 16) of the same frames; actions:
  // the rollout's per-video-frame inputs, at least max(1, 4 * (first_frame + F - 1)) frames;
  // first_frame: the absolute latent frame of x[0]. kv_out (optional) receives the chunk's K/V.
  // Returns [F, 16, 44, 80] in x's dtype. Throws wm::Error on a shape mismatch.
  at::Tensor forward_chunk(const at::Tensor& x, const at::Tensor& t, const at::Tensor& cond, const Mg2Visual& visual,
                           const Mg2Actions& actions, int64_t first_frame, const Mg2Context& ctx,
                           Mg2ChunkKv* kv_out = nullptr);

  // The main KV layout: num_layers x num_heads x head_dim, (t, h, w) RoPE as Wan.
  KvSpec kv_spec(at::Device device, at::ScalarType dtype = at::kFloat) const;
  // Token positions [F * 880, 3] (t, h, w) of frames first_frame .. first_frame + F - 1.
  at::Tensor positions(int64_t first_frame, int64_t F) const;
  at::ScalarType dtype() const { return patch_embedding->weight.scalar_type(); }
  at::Device device() const { return patch_embedding->weight.device(); }
  // Indices of the blocks with an action module, in block order.
  const std::vector<int>& action_blocks() const { return action_blocks_; }

  torch::nn::Conv3d patch_embedding{nullptr};
  torch::nn::Sequential time_embedding{nullptr}, time_projection{nullptr};
  Mg2ImgEmb img_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  WanHead head{nullptr};

 private:
  Mg2Config cfg_;
  RopeSpec rope_;
  std::vector<int> action_blocks_;
};
TORCH_MODULE(Mg2Dit);

// Sinusoidal timestep features as Wan (wan_sinusoid).
inline at::Tensor mg2_sinusoid(const at::Tensor& t, int64_t dim) { return wan_sinusoid(t, dim); }

}  // namespace wm::dit
