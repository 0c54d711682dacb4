#pragma once
// The pieces of a causal Wan DiT block that Matrix-Game-2.0 (mg2_model.h) and LingBot-World-Fast
// (lingbot_model.h) share: the q/k/v/o attention with RMS-normed q and k, the modulated
// self-attention over cached K/V with 3D RoPE (keys cached after rotation, angles in float64), the
// cross-attention over precomputed K/V, the modulated FFN, the sinusoidal time embedding, patching
// and the head. Module names mirror Wan checkpoint keys.
//
// Modulation comes in groups: m [G, 6, dim] modulates the n tokens of a chunk split into G equal
// runs (G = F: one row per latent frame, as Matrix-Game-2.0 computes it; G = n: one row per
// token, as LingBot-World-Fast does; G = 1: the whole chunk).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <utility>
#include <vector>

#include "runtime/block.h"
#include "runtime/kv_spec.h"
#include "runtime/window.h"

namespace wm::dit {

// Wan's RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, cast back, then times the weight in x's dtype.
struct WanRmsNormImpl : torch::nn::Module {
  WanRmsNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(WanRmsNorm);

// q, k, v, o projections with full-width RMSNorm on q and k (self- and cross-attention alike).
struct WanAttentionImpl : torch::nn::Module {
  WanAttentionImpl(int64_t dim, double eps);
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  WanRmsNorm norm_q{nullptr}, norm_k{nullptr};
};
TORCH_MODULE(WanAttention);

// head.head (dim -> patch volume x out_dim, ordered (pt, ph, pw, c), c fastest) and head.modulation [1, 2, dim].
struct WanHeadImpl : torch::nn::Module {
  WanHeadImpl(int64_t dim, int64_t patch_volume, int64_t out_dim);
  torch::nn::Linear head{nullptr};
  at::Tensor modulation;
};
TORCH_MODULE(WanHead);

// Per-layer cross-attention K/V of a context (CLIP tokens, text): [1, heads, n_ctx, head_dim] each.
struct WanCrossKv {
  std::vector<at::Tensor> k, v;
};

// What a chunk attends to besides itself: a window (the chunk's K/V staged into it, the window
// unchanged), or per layer the earlier K/V to prepend ([heads, n_ctx, head_dim]), or nothing.
struct WanKvContext {
  KvWindow* window = nullptr;
  const std::vector<LayerKv>* main = nullptr;
};

// The token layout of one chunk: F latent frames of P = gh x gw patches, n = F * P tokens,
// positions pos [n, 3] (t, h, w) and the model's RoPE.
struct WanTokens {
  int64_t F = 0, P = 0, n = 0, dim = 0, heads = 0, head_dim = 0;
  double eps = 1e-6;
  at::Tensor pos;
  const RopeSpec* rope = nullptr;
};

// The layout of a chunk of F latent frames of gh x gw patches at positions pos [F * gh * gw, 3]
// (wan_positions) for a Wan config `c` (its dim, num_heads, head_dim(), eps) and its RoPE, which
// must outlive the result.
template <class WanConfig>
WanTokens wan_tokens(const WanConfig& c, int64_t F, int64_t gh, int64_t gw, at::Tensor pos, const RopeSpec& rope) {
  WanTokens tok;
  tok.F = F;
  tok.P = gh * gw;
  tok.n = F * tok.P;
  tok.dim = c.dim;
  tok.heads = c.num_heads;
  tok.head_dim = c.head_dim();
  tok.eps = c.eps;
  tok.pos = std::move(pos);
  tok.rope = &rope;
  return tok;
}

// The self-attention K/V a Wan DiT of config `c` caches: num_layers layers of num_heads heads of
// head_dim(), rotated by `rope`, in dtype on device.
template <class WanConfig>
KvSpec wan_kv_spec(const WanConfig& c, const RopeSpec& rope, at::Device device, at::ScalarType dtype) {
  KvSpec s;
  s.n_layers = c.num_layers;
  s.n_kv_heads = c.num_heads;
  s.head_dim = c.head_dim();
  s.dtype = dtype;
  s.device = device;
  s.rope = rope;
  return s;
}

// LayerNorm without affine parameters: statistics in float32, result in x's dtype.
at::Tensor wan_plain_layer_norm(const at::Tensor& x, double eps);
// An affine LayerNorm module applied with float32 statistics, result in x's dtype.
at::Tensor wan_affine_layer_norm(const torch::nn::LayerNormImpl& ln, const at::Tensor& x);

// Sinusoidal timestep features as Wan: [cos(t f_i), sin(t f_i)], f_i = 10000^(-i / (dim/2)),
// computed in float64; t [...] -> [..., dim] float64.
at::Tensor wan_sinusoid(const at::Tensor& t, int64_t dim);

// Token positions [F * gh * gw, 3] (t, h, w) of frames first_frame .. first_frame + F - 1, int64 on the CPU.
at::Tensor wan_positions(int64_t first_frame, int64_t F, int64_t gh, int64_t gw);

// Patchify x [F, C, gh * ph, gw * pw] by a Conv3d of kernel = stride = (1, ph, pw) as a matmul in
// the weight's (C, pt, ph, pw) order: [1, F * gh * gw, dim].
at::Tensor wan_patch_embed(const torch::nn::Conv3dImpl& conv, const at::Tensor& x, int64_t ph, int64_t pw);

// x [1, n, D] -> LN(x) * (1 + scale) + shift with scale, shift [G, 1, D] (n / G tokens a row).
at::Tensor wan_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

// Row i of a block's modulation m [G, 6, D] as [G, 1, D].
inline at::Tensor wan_mod(const at::Tensor& m, int i) { return m.select(1, i).unsqueeze(1); }

// x + gate * y for x, y [1, n, D] and gate [G, 1, D].
at::Tensor wan_gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate);

// The self-attention branch of block `layer`, ungated: q, k, v of y [1, n, D] (q, k RMS-normed and
// rotated at tok.pos), attention over ctx's K/V and the chunk's own, then o. kv_out (optional)
// receives the chunk's rotated k, v [H, n, d], positions and zero log-weights. Returns [1, n, D].
at::Tensor wan_self_attention(WanAttentionImpl& sa, const at::Tensor& y, const WanTokens& tok, int layer,
                              const WanKvContext& ctx, LayerKv* kv_out);

// The cross-attention branch: q of x (already normed by the caller) over k, v [1, H, L, d]
// (no RoPE, no mask), then o. Returns [1, n, D].
at::Tensor wan_cross_attention(WanAttentionImpl& ca, const at::Tensor& x, const at::Tensor& k, const at::Tensor& v,
                               const WanTokens& tok);

// A context's cross-attention K/V through one block's k (with norm_k) and v: ctx [1, L, D] ->
// k, v [1, H, L, d].
std::pair<at::Tensor, at::Tensor> wan_cross_kv(WanAttentionImpl& ca, const at::Tensor& ctx, int64_t heads);

// The same through the cross_attn of each of the first `layers` blocks, block(l) giving block l
// (a model's own, or a streamed model's slot filled with it): per layer k, v [1, H, L, d].
template <class BlockAt>
WanCrossKv wan_context_kv(BlockAt&& block, int layers, const at::Tensor& ctx, int64_t heads) {
  WanCrossKv kv;
  for (int l = 0; l < layers; ++l) {
    auto [k, v] = wan_cross_kv(*block(l).cross_attn, ctx, heads);
    kv.k.push_back(k);
    kv.v.push_back(v);
  }
  return kv;
}

// The same over a ModuleList of blocks of type Block.
template <class Block>
WanCrossKv wan_context_kv(torch::nn::ModuleListImpl& blocks, int layers, const at::Tensor& ctx, int64_t heads) {
  return wan_context_kv([&](int l) -> Block& { return *blocks.ptr(l)->as<Block>(); }, layers, ctx, heads);
}

// The head: LN(h) * (1 + scale) + shift with (shift, scale) = head.modulation + e (e [G, D]), the
// linear to the patch, then unpatchify to [F, C, gh * ph, gw * pw].
at::Tensor wan_head(WanHeadImpl& head, const at::Tensor& h, const at::Tensor& e, const WanTokens& tok, int64_t gh,
                    int64_t gw, int64_t ph, int64_t pw, int64_t C);

}  // namespace wm::dit
