#pragma once
// Matrix-Game-2.0's ActionModule: the keyboard and mouse conditioning inside the DiT blocks that
// action_config.blocks lists, after the cross-attention and before the FFN, ungated.
//
// Inputs are per video frame (4 a latent frame, plus the first): keyboard [Nv, kd] (multi-hot
// W S A D for universal, W S for gta_drive, one-hot of 7 for templerun) and mouse [Nv, 2]
// (pitch, yaw). Latent frame j reads video frames [4j - 12, 4j), a negative index standing for
// frame 0 (upstream pads the front with 12 copies of frame 0).
//   mouse:    per spatial token, features [hidden | 12 x (pitch, yaw)] -> mouse_mlp -> t_qkv;
//             q, k RMS-normalised (no weight), action RoPE; temporal attention of each spatial
//             token over its own cached frames and the chunk's; x += proj_mouse(attn)
//   keyboard: each video frame embedded (keyboard_embed), a latent frame's 12 concatenated ->
//             keyboard_attn_kv -> k, v (one per latent frame); q = mouse_attn_q(x); q, k
//             RMS-normalised, action RoPE; every token attends to the cached frames' and the
//             chunk's keyboard keys; x += proj_keyboard(attn)
// The action RoPE (theta 256) turns only the first rope_dim_list[0] channels of each head by
// the absolute latent frame; the h and w axes sit at position 0 (identity).
// Keys: keyboard_embed.{0,2}, mouse_attn_q, keyboard_attn_kv, proj_keyboard, key_attn_{q,k}_norm,
// mouse_mlp.{0,2,3}, t_qkv, proj_mouse, img_attn_{q,k}_norm (the four norm weights exist in the
// checkpoint but upstream never applies them: its RMSNorm here has no weight).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "dit/mg2_config.h"

namespace wm::dit {

// The rollout's actions per video frame.
struct Mg2Actions {
  at::Tensor keyboard;  // [Nv, keyboard_dim] float
  at::Tensor mouse;     // [Nv, 2] float, or undefined when the model has no mouse branch
};

// The action modules' K/V over some latent frames, per action block (in block order).
struct ActionKv {
  std::vector<at::Tensor> kb_k, kb_v;  // [frames, heads, head_dim], keys rotated
  std::vector<at::Tensor> ms_k, ms_v;  // [880, frames, heads, head_dim] (empty: no mouse branch)

  bool empty() const { return kb_k.empty() && ms_k.empty(); }
  int64_t n_frames() const;
  size_t nbytes() const;
  // The frames of several in order, concatenated (all of one layout); empty input: empty result.
  static ActionKv cat(const std::vector<const ActionKv*>& parts);
  // The last n frames (all if fewer).
  ActionKv last_frames(int64_t n) const;
  // Copies on `device`.
  ActionKv to(at::Device device) const;
  // Keys re-anchored by `delta` latent frames (values untouched): the action RoPE of frame f + delta.
  ActionKv reanchored(int64_t delta, const Mg2ActionConfig& a) const;
};

// A weight the checkpoint holds but upstream never uses (the action module's RMSNorm weights).
struct Mg2UnusedWeightImpl : torch::nn::Module {
  explicit Mg2UnusedWeightImpl(int64_t dim);
  at::Tensor weight;
};
TORCH_MODULE(Mg2UnusedWeight);

struct Mg2ActionModuleImpl : torch::nn::Module {
  Mg2ActionModuleImpl(const Mg2ActionConfig& a, int64_t dim);

  // One chunk: x [1, F * S, dim] (S spatial tokens per frame) -> [1, F * S, dim]. actions: at
  // least max(1, 4 * (first_frame + F - 1)) video frames. ctx (layer `slot` of an ActionKv,
  // may be null or hold 0 frames): the cached frames this chunk attends to besides itself.
  // out (optional) receives this chunk's K/V in layer `slot`.
  at::Tensor forward(const at::Tensor& x, const Mg2Actions& actions, int64_t first_frame, int64_t F, int64_t S,
                     const ActionKv* ctx, size_t slot, ActionKv* out);

  Mg2ActionConfig cfg;
  torch::nn::Sequential keyboard_embed{nullptr};  // Linear(kd, hidden), SiLU, Linear(hidden, hidden)
  torch::nn::Linear mouse_attn_q{nullptr}, keyboard_attn_kv{nullptr}, proj_keyboard{nullptr};
  Mg2UnusedWeight key_attn_q_norm{nullptr}, key_attn_k_norm{nullptr};
  torch::nn::Sequential mouse_mlp{nullptr};  // Linear, GELU(tanh), Linear, LayerNorm(eps 1e-5)
  torch::nn::Linear t_qkv{nullptr}, proj_mouse{nullptr};
  Mg2UnusedWeight img_attn_q_norm{nullptr}, img_attn_k_norm{nullptr};
};
TORCH_MODULE(Mg2ActionModule);

// Video-frame indices [F, 12] that latent frames first_frame .. first_frame + F - 1 read (negative
// indices as 0). Throws wm::Error if n_video_frames is too short for them.
at::Tensor mg2_action_window(const Mg2ActionConfig& a, int64_t first_frame, int64_t F, int64_t n_video_frames);

// The action RoPE of x [..., F, heads, head_dim] at latent frames first_frame + (0..F-1) (the
// frame axis at dim -3), the first `channels` channels in interleaved pairs, computed in float32.
at::Tensor mg2_action_rope(const at::Tensor& x, int64_t first_frame, int64_t channels, double theta);

}  // namespace wm::dit
