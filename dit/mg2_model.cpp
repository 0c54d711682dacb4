#include "dit/mg2_model.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/options/normalization.h>

#include <cmath>
#include <utility>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm::dit {
namespace nn = torch::nn;

namespace {

// forward_chunk's inputs against the config: latents x [F, out_dim, h, w], the condition
// [F, cond_channels, h, w], a visual context of every layer, first_frame >= 0. Throws wm::Error.
void check_chunk(const Mg2Config& c, const at::Tensor& x_in, const at::Tensor& cond, const Mg2Visual& visual,
                 int64_t first_frame) {
  WM_CHECK(x_in.dim() == 4 && x_in.size(1) == c.out_dim && x_in.size(2) == c.latent_height &&
               x_in.size(3) == c.latent_width,
           "latents must be [F, ", c.out_dim, ", ", c.latent_height, ", ", c.latent_width, "], got ", x_in.sizes());
  const int64_t F = x_in.size(0);
  WM_CHECK(cond.dim() == 4 && cond.size(0) == F && cond.size(1) == c.cond_channels() &&
               cond.size(2) == c.latent_height && cond.size(3) == c.latent_width,
           "the condition must be [", F, ", ", c.cond_channels(), ", ", c.latent_height, ", ", c.latent_width,
           "] (mask | image latent), got ", cond.sizes());
  WM_CHECK(first_frame >= 0, "first_frame must be >= 0, got ", first_frame);
  WM_CHECK(int(visual.k.size()) == c.num_layers && int(visual.v.size()) == c.num_layers,
           "the visual context holds ", visual.k.size(), " layers, the model ", c.num_layers);
}

// The context (a window, or the earlier chunks' K/V) holds every layer, of the model's heads.
void check_context(const Mg2Config& c, const Mg2Context& ctx) {
  const int64_t H = c.num_heads, d = c.head_dim();
  if (ctx.window) {
    const KvSpec& ws = ctx.window->spec();
    WM_CHECK(ws.n_layers == c.num_layers && ws.n_kv_heads == H && ws.head_dim == d, "window holds ", ws.n_layers,
             " layers x ", ws.n_kv_heads, " heads x ", ws.head_dim, ", the model ", c.num_layers, " x ", H, " x ", d);
  } else if (ctx.main) {
    WM_CHECK(int(ctx.main->size()) == c.num_layers, "context holds ", ctx.main->size(), " layers, the model ",
             c.num_layers);
  }
}

}  // namespace

Mg2BlockImpl::Mg2BlockImpl(const Mg2Config& c, int index) {
  self_attn = register_module("self_attn", Mg2Attention(c.dim, c.eps));
  norm3 = register_module("norm3", nn::LayerNorm(nn::LayerNormOptions({int64_t(c.dim)}).eps(c.eps)));
  cross_attn = register_module("cross_attn", Mg2Attention(c.dim, c.eps));
  if (c.action && c.action->has_block(index))
    action_model = register_module("action_model", Mg2ActionModule(*c.action, c.dim));
  ffn = register_module("ffn", nn::Sequential(nn::Linear(c.dim, c.ffn_dim),
                                              nn::GELU(nn::GELUOptions().approximate("tanh")),
                                              nn::Linear(c.ffn_dim, c.dim)));
  modulation = register_parameter("modulation", at::zeros({1, 6, c.dim}));
}

Mg2ImgEmbImpl::Mg2ImgEmbImpl(const Mg2Config& c) {
  const int64_t in = c.clip_dim;
  proj = register_module(
      "proj", nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({in}).eps(1e-5)), nn::Linear(in, in), nn::GELU(),
                             nn::Linear(in, c.dim), nn::LayerNorm(nn::LayerNormOptions({int64_t(c.dim)}).eps(1e-5))));
}

Mg2DitImpl::Mg2DitImpl(Mg2Config cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  const auto& c = cfg_;
  patch_embedding = register_module(
      "patch_embedding", nn::Conv3d(nn::Conv3dOptions(c.in_dim, c.dim, {c.patch_t, c.patch_h, c.patch_w})
                                        .stride({c.patch_t, c.patch_h, c.patch_w})));
  time_embedding = register_module(
      "time_embedding", nn::Sequential(nn::Linear(c.freq_dim, c.dim), nn::SiLU(), nn::Linear(c.dim, c.dim)));
  time_projection = register_module("time_projection", nn::Sequential(nn::SiLU(), nn::Linear(c.dim, 6 * c.dim)));
  blocks = register_module("blocks", nn::ModuleList());
  for (int l = 0; l < c.num_layers; ++l) {
    blocks->push_back(Mg2Block(c, l));
    if (c.action && c.action->has_block(l)) action_blocks_.push_back(l);
  }
  head = register_module("head", WanHead(c.dim, int64_t(c.patch_t) * c.patch_h * c.patch_w, c.out_dim));
  img_emb = register_module("img_emb", Mg2ImgEmb(c));
  rope_ = RopeSpec::video3d(c.head_dim(), 10000.0);
}

KvSpec Mg2DitImpl::kv_spec(at::Device device, at::ScalarType dtype) const {
  return wan_kv_spec(cfg_, rope_, device, dtype);
}

at::Tensor Mg2DitImpl::positions(int64_t first_frame, int64_t F) const {
  return wan_positions(first_frame, F, cfg_.grid_h(), cfg_.grid_w());
}

Mg2Visual Mg2DitImpl::encode_visual(const at::Tensor& clip_tokens) {
  at::Tensor tok = clip_tokens.dim() == 2 ? clip_tokens.unsqueeze(0) : clip_tokens;
  WM_CHECK(tok.dim() == 3 && tok.size(0) == 1 && tok.size(2) == cfg_.clip_dim, "CLIP tokens must be [n, ",
           cfg_.clip_dim, "] or [1, n, ", cfg_.clip_dim, "], got ", clip_tokens.sizes());
  const auto dt = dtype();
  at::Tensor x = tok.to(device(), dt);
  auto& p = *img_emb->proj;
  x = wan_affine_layer_norm(*p.ptr<nn::LayerNormImpl>(0), x);
  x = p.ptr<nn::LinearImpl>(1)->forward(x);
  x = at::gelu(x);
  x = p.ptr<nn::LinearImpl>(3)->forward(x);
  x = wan_affine_layer_norm(*p.ptr<nn::LayerNormImpl>(4), x);
  return wan_context_kv<Mg2BlockImpl>(*blocks, cfg_.num_layers, x, cfg_.num_heads);
}

at::Tensor Mg2DitImpl::forward_chunk(const at::Tensor& x_in, const at::Tensor& t_in, const at::Tensor& cond,
                                     const Mg2Visual& visual, const Mg2Actions& actions, int64_t first_frame,
                                     const Mg2Context& ctx, Mg2ChunkKv* kv_out) {
  const auto& c = cfg_;
  check_chunk(c, x_in, cond, visual, first_frame);
  const int64_t F = x_in.size(0);
  const auto dt = dtype();
  const auto dev = device();
  const int64_t D = c.dim, gh = c.grid_h(), gw = c.grid_w();
  at::Tensor t = t_in.to(dev, at::kFloat);
  if (t.dim() == 0) t = t.expand({F});
  WM_CHECK(t.dim() == 1 && t.size(0) == F, "timesteps must be a scalar or [", F, "], got ", t_in.sizes());
  check_context(c, ctx);

  at::Tensor h = wan_patch_embed(*patch_embedding, at::cat({x_in.to(dev, dt), cond.to(dev, dt)}, 1), c.patch_h,
                                 c.patch_w);  // [1, n, D]
  at::Tensor e = time_embedding->forward(wan_sinusoid(t, c.freq_dim).to(dt));  // [F, D]
  at::Tensor e0 = time_projection->forward(e).view({F, 6, D});
  const WanTokens tok = wan_tokens(c, F, gh, gw, positions(first_frame, F), rope_);
  const WanKvContext wctx{ctx.window, ctx.main};

  if (kv_out) {
    kv_out->main.assign(c.num_layers, LayerKv{});
    kv_out->action = ActionKv{};
  }
  size_t action_slot = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    auto& blk = *blocks->ptr(l)->as<Mg2BlockImpl>();
    const at::Tensor m = blk.modulation.to(dt) + e0;  // [F, 6, D]: per latent frame
    at::Tensor a = wan_self_attention(*blk.self_attn, wan_modulate(h, wan_mod(m, 0), wan_mod(m, 1), c.eps), tok, l,
                                      wctx, kv_out ? &kv_out->main[l] : nullptr);
    h = wan_gated_add(h, a, wan_mod(m, 2));
    // Cross-attention to the CLIP tokens (no RoPE, no gate).
    h = h + wan_cross_attention(*blk.cross_attn, wan_affine_layer_norm(*blk.norm3, h), visual.k[l], visual.v[l], tok);
    if (blk.action_model) {
      h = blk.action_model->forward(h, actions, first_frame, F, tok.P, ctx.action, action_slot,
                                    kv_out ? &kv_out->action : nullptr);
      ++action_slot;
    }
    h = wan_gated_add(h, blk.ffn->forward(wan_modulate(h, wan_mod(m, 3), wan_mod(m, 4), c.eps)), wan_mod(m, 5));
  }
  // Head: modulated by e itself (head.modulation + e), then unpatchify.
  return wan_head(*head, h, e, tok, gh, gw, c.patch_h, c.patch_w, c.out_dim).to(x_in.scalar_type());
}

}  // namespace wm::dit
