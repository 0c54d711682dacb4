#pragma once
// A causal DiT of the Wan family (the backbone of Self-Forcing, CausVid and Matrix-Game-2.0),
// conditioned per frame on the camera pose and the action, streaming chunk by chunk over a KV
// window.
//
// Submodule names mirror Wan checkpoint keys: patch_embedding, time_embedding.{0,2},
// time_projection.1, blocks.N.{self_attn.{q,k,v,o,norm_q,norm_k}, ffn.{0,2}, modulation},
// head.{head, modulation}. Additions of this project: pose_embedding.{0,2},
// action_embedding.{0,2}, ray_embedding.{0,2}, reference_embedding (cond.warp_reference: the
// reference frame's patches, embedded like the latents' and added to their tokens). Wan's
// cross-attention (text) is absent.
//
// Block (as Wan, per-frame modulation as CausVid / Self-Forcing):
//   e0 = time_projection(e) [.., 6, dim], m = blocks.N.modulation + e0 (per frame)
//   x += gate_msa * self_attn(LayerNorm(x) * (1 + scale_msa) + shift_msa)   (3D RoPE on q, k)
//   x += gate_mlp * ffn(LayerNorm(x) * (1 + scale_mlp) + shift_mlp)         (GELU tanh)
// e = time_embedding(sinusoid(t * timestep_scale)) + pose_embedding(pose features)
//     + action_embedding(action), per frame. Optional per token: ray_embedding(camera position
// and ray-yaw features) added after the patch embedding, and a yaw rotary on q and k
// (cond.yaw_rope_pairs) baked into the stored keys like the (t, h, w) RoPE.
//
// Timestep convention (rectified flow): x_t = (1 - t) * x0 + t * noise, t in [0, 1] (t = 1 is
// pure noise, t = 0 clean), and the model predicts the velocity v = noise - x0: its head outputs
// v directly (prediction "v", as Wan), or x0 (prediction "x0"), which forward_* turn into the
// velocity (x_t - x0) / t, so samplers and callers see one convention.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <vector>

#include "dit/conditioning.h"
#include "dit/config.h"
#include "runtime/block.h"
#include "runtime/kv_spec.h"
#include "runtime/window.h"

namespace wm::dit {

// RMSNorm over the last dim with a learned scale (Wan's WanRMSNorm), computed in float32.
struct RmsNormImpl : torch::nn::Module {
  RmsNormImpl(int64_t dim, double eps);
  // x [..., dim] -> same shape and dtype.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(const DitConfig& c);
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  RmsNorm norm_q{nullptr}, norm_k{nullptr};  // null when qk_norm is off
};
TORCH_MODULE(SelfAttention);

struct DitBlockImpl : torch::nn::Module {
  DitBlockImpl(const DitConfig& c);
  SelfAttention self_attn{nullptr};
  torch::nn::Sequential ffn{nullptr};  // 0: Linear(dim, ffn_dim), 1: GELU(tanh), 2: Linear(ffn_dim, dim)
  at::Tensor modulation;               // [1, 6, dim]
};
TORCH_MODULE(DitBlock);

struct HeadImpl : torch::nn::Module {
  HeadImpl(const DitConfig& c);
  torch::nn::Linear head{nullptr};  // dim -> patch_dim, output channels ordered (pt, ph, pw, C)
  at::Tensor modulation;            // [1, 2, dim]
};
TORCH_MODULE(Head);

// Options of the training pass over a whole sequence.
struct SequenceOptions {
  at::Tensor frame_index;        // [T] int64: absolute latent frame index per frame (default 0..T-1)
  int64_t block_frames = 0;      // frames per causal block (0: frames_per_chunk)
  at::Tensor key_logw;           // [n] float32 added to every key's logit (log-weight; -inf drops it)
  at::Tensor attn_bias;          // [n, n] or [B, 1, n, n] float32 additive bias replacing the
                                 // block-causal mask (see chunk_visibility_bias); dense, so
                                 // every query reads every key (AttentionOptions::bias)
  std::vector<LayerKv>* kv_out = nullptr;  // B == 1 only: per-layer K (rotated), V, positions
  // Replaces the attention of every layer when set (reference checks): layer, rotated q, k and v
  // [B, H, n, d] -> [B, H, n, d]; block_frames, key_logw and attn_bias are then its business.
  std::function<at::Tensor(int, const at::Tensor&, const at::Tensor&, const at::Tensor&)> attention;
};

class CausalDitImpl : public torch::nn::Module {
 public:
  explicit CausalDitImpl(DitConfig cfg);

  const DitConfig& config() const { return cfg_; }

  // Velocity of one chunk attending to [window ; itself] (bidirectional within the chunk).
  // x_t [F, C, h, w]; t: scalar or [F] in [0, 1]; cond for the F frames ([F, 3], [F, A]);
  // first_frame: absolute latent frame index of x_t[0]; window may be null (no context). The
  // window is only staged into (its content is unchanged). kv_out (optional) receives per layer
  // K [n_heads, F * tokens_per_frame, head_dim] (rotated), V, positions [n, 3], logw zeros.
  // Returns the velocity [F, C, h, w] in x_t's dtype.
  at::Tensor forward_chunk(const at::Tensor& x_t, const at::Tensor& t, const FrameCond& cond, int64_t first_frame,
                           KvWindow* window, std::vector<LayerKv>* kv_out = nullptr);

  // One pass over a whole sequence for training (teacher / diffusion forcing): x [T, C, h, w]
  // or [B, T, C, h, w]; t [T] or [B, T]; cond [T, ..] or [B, T, ..]. Each block of
  // block_frames frames sees itself and earlier blocks only (unless opt.attn_bias says
  // otherwise). Returns the velocity, shaped as x.
  at::Tensor forward_sequence(const at::Tensor& x, const at::Tensor& t, const FrameCond& cond,
                              const SequenceOptions& opt = {});

  // The KV layout this model writes: n_layers, n_kv_heads = n_heads, head_dim, its RoPE.
  KvSpec kv_spec(at::Device device, at::ScalarType dtype = at::kFloat) const;
  // Token positions [n_frames * tokens_per_frame, 3] int64 (CPU) for frames frame_index [n_frames].
  at::Tensor positions(const at::Tensor& frame_index) const;

  // Wan's initialisation: linears Xavier-uniform with zero bias, patch embedding Xavier over
  // its flattened weight, time/conditioning embeddings normal(0.02), modulations
  // randn / sqrt(dim). With zero_head the head (and the conditioning outputs) start at zero,
  // as Wan and adaLN-zero train; tests and benchmarks keep it false to exercise every path.
  void init_weights(uint64_t seed, bool zero_head = false);

  torch::nn::Conv3d patch_embedding{nullptr};  // weight [dim, C, pt, ph, pw]
  torch::nn::Sequential time_embedding{nullptr}, time_projection{nullptr};
  torch::nn::Sequential pose_embedding{nullptr}, action_embedding{nullptr}, ray_embedding{nullptr};
  torch::nn::Linear reference_embedding{nullptr};  // warp_reference: (C + 1) * pt * ph * pw -> dim, no bias
  torch::nn::ModuleList blocks{nullptr};
  Head head{nullptr};

 private:
  // The shared body. x [B, T, C, h, w]; t [B, T]; frame_index [T]; attend(l, q, k, v) runs
  // layer l's attention on [B, H, n, d] rotated q, k and v and returns [B, H, n, d].
  template <class Attend>
  at::Tensor run(const at::Tensor& x, const at::Tensor& t, const FrameCond& cond, const at::Tensor& frame_index,
                 Attend&& attend, std::vector<LayerKv>* kv_out);
  // run()'s first step: x [B, T, C, h, w] patchified through the patch embedding, plus the
  // warped reference's embedding when the config and cond have one (*ref: it as [B or 1, T,
  // C + 1, h, w], checked). Returns [B, n, dim] in the weights' dtype.
  at::Tensor embed_patches(const at::Tensor& x, const FrameCond& cond, at::Tensor* ref);
  // run()'s last step: the head on the modulated tokens y [B, n, dim], unpatchified to
  // [B, T, C, h, w]; the velocity (for an x0 head, from x and t, its residual on ref's frames).
  at::Tensor predict(const at::Tensor& y, const at::Tensor& x, const at::Tensor& t, const at::Tensor& ref);

  DitConfig cfg_;
};
TORCH_MODULE(CausalDit);

// Sinusoidal timestep features as Wan: [cos(t f_i), sin(t f_i)], f_i = 10000^(-i / (dim/2)).
// t [...] -> [..., dim] float32 (computed in float64).
at::Tensor sinusoidal_embedding(const at::Tensor& t, int64_t dim);

// Token-level additive bias [n_q_chunks * tokens_per_chunk, n_k_chunks * tokens_per_chunk]
// (float32, 0 where visible, -inf where hidden) from a chunk-level visibility matrix visible
// [n_q_chunks, n_k_chunks] bool. Build block-causal, context-dropout or teacher-forcing masks
// with it for SequenceOptions::attn_bias.
at::Tensor chunk_visibility_bias(const at::Tensor& visible, int64_t tokens_per_chunk, at::Device device);

// Chunk visibility for teacher forcing over [clean chunks 0..N-1 ; noisy chunks 0..N-1] (2N x 2N):
// clean i sees clean j <= i; noisy i sees clean j < i and itself.
at::Tensor teacher_forcing_visibility(int64_t n_chunks);

}  // namespace wm::dit
