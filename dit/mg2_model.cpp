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

// Wan's LayerNorm without affine parameters: statistics in float32, result in x's dtype.
at::Tensor plain_layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps).to(x.scalar_type());
}

// An affine LayerNorm module applied with float32 statistics, result in x's dtype.
at::Tensor affine_layer_norm(const nn::LayerNormImpl& ln, const at::Tensor& x) {
  const auto& o = ln.options;
  return at::layer_norm(x.to(at::kFloat), o.normalized_shape(), ln.weight.to(at::kFloat), ln.bias.to(at::kFloat),
                        o.eps())
      .to(x.scalar_type());
}

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

// Layer l's self-attention of the chunk's q over its k, v [H, n, d] and the context's: the
// window's (k, v staged into it), or the earlier chunks' prepended. Returns [H, n, d] in dt.
at::Tensor attend_in_context(int l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const Mg2Context& ctx, at::ScalarType dt, at::Device dev) {
  if (ctx.window) {
    KvWindow::Staged st = ctx.window->stage(l, k, v);
    AttentionOptions o;
    o.n_window = st.n_window;
    return attention(q.to(st.k.scalar_type()), st.k, st.v, st.logw, o).out.to(dt);
  }
  at::Tensor kk = k, vv = v;
  if (ctx.main && (*ctx.main)[l].n_tokens() > 0) {
    kk = at::cat({(*ctx.main)[l].k.to(dev, dt), k}, 1);
    vv = at::cat({(*ctx.main)[l].v.to(dev, dt), v}, 1);
  }
  return attention(q, kk, vv, at::Tensor()).out;
}

}  // namespace

Mg2RmsNormImpl::Mg2RmsNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor Mg2RmsNormImpl::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
  return y * weight.to(x.scalar_type());
}

Mg2AttentionImpl::Mg2AttentionImpl(int64_t dim, double eps) {
  q = register_module("q", nn::Linear(dim, dim));
  k = register_module("k", nn::Linear(dim, dim));
  v = register_module("v", nn::Linear(dim, dim));
  o = register_module("o", nn::Linear(dim, dim));
  norm_q = register_module("norm_q", Mg2RmsNorm(dim, eps));
  norm_k = register_module("norm_k", Mg2RmsNorm(dim, eps));
}

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

Mg2HeadImpl::Mg2HeadImpl(const Mg2Config& c) {
  head = register_module("head", nn::Linear(c.dim, int64_t(c.patch_t) * c.patch_h * c.patch_w * c.out_dim));
  modulation = register_parameter("modulation", at::zeros({1, 2, c.dim}));
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
  head = register_module("head", Mg2Head(c));
  img_emb = register_module("img_emb", Mg2ImgEmb(c));
  rope_ = RopeSpec::video3d(c.head_dim(), 10000.0);
}

KvSpec Mg2DitImpl::kv_spec(at::Device device, at::ScalarType dtype) const {
  KvSpec s;
  s.n_layers = cfg_.num_layers;
  s.n_kv_heads = cfg_.num_heads;
  s.head_dim = cfg_.head_dim();
  s.dtype = dtype;
  s.device = device;
  s.rope = rope_;
  return s;
}

at::Tensor Mg2DitImpl::positions(int64_t first_frame, int64_t F) const {
  const int64_t gh = cfg_.grid_h(), gw = cfg_.grid_w(), P = gh * gw;
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor t = at::arange(first_frame, first_frame + F, lo).view({F, 1}).expand({F, P});
  at::Tensor h = at::arange(gh, lo).view({gh, 1}).expand({gh, gw}).reshape({1, P}).expand({F, P});
  at::Tensor w = at::arange(gw, lo).view({1, gw}).expand({gh, gw}).reshape({1, P}).expand({F, P});
  return at::stack({t, h, w}, -1).reshape({F * P, 3}).contiguous();
}

at::Tensor mg2_sinusoid(const at::Tensor& t, int64_t dim) {
  WM_CHECK(dim % 2 == 0, "dim must be even, got ", dim);
  const int64_t half = dim / 2;
  auto dopt = at::TensorOptions().dtype(at::kDouble).device(t.device());
  at::Tensor f = at::pow(10000.0, -at::arange(half, dopt) / double(half));
  at::Tensor ang = t.to(at::kDouble).unsqueeze(-1) * f;
  return at::cat({ang.cos(), ang.sin()}, -1);
}

Mg2Visual Mg2DitImpl::encode_visual(const at::Tensor& clip_tokens) {
  at::Tensor tok = clip_tokens.dim() == 2 ? clip_tokens.unsqueeze(0) : clip_tokens;
  WM_CHECK(tok.dim() == 3 && tok.size(0) == 1 && tok.size(2) == cfg_.clip_dim, "CLIP tokens must be [n, ",
           cfg_.clip_dim, "] or [1, n, ", cfg_.clip_dim, "], got ", clip_tokens.sizes());
  const auto dt = dtype();
  at::Tensor x = tok.to(device(), dt);
  auto& p = *img_emb->proj;
  x = affine_layer_norm(*p.ptr<nn::LayerNormImpl>(0), x);
  x = p.ptr<nn::LinearImpl>(1)->forward(x);
  x = at::gelu(x);
  x = p.ptr<nn::LinearImpl>(3)->forward(x);
  x = affine_layer_norm(*p.ptr<nn::LayerNormImpl>(4), x);
  Mg2Visual vis;
  const int64_t H = cfg_.num_heads, d = cfg_.head_dim(), n = x.size(1);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    auto& ca = *blocks->ptr(l)->as<Mg2BlockImpl>()->cross_attn;
    vis.k.push_back(ca.norm_k->forward(ca.k->forward(x)).view({1, n, H, d}).transpose(1, 2).contiguous());
    vis.v.push_back(ca.v->forward(x).view({1, n, H, d}).transpose(1, 2).contiguous());
  }
  return vis;
}

at::Tensor Mg2DitImpl::forward_chunk(const at::Tensor& x_in, const at::Tensor& t_in, const at::Tensor& cond,
                                     const Mg2Visual& visual, const Mg2Actions& actions, int64_t first_frame,
                                     const Mg2Context& ctx, Mg2ChunkKv* kv_out) {
  const auto& c = cfg_;
  check_chunk(c, x_in, cond, visual, first_frame);
  const int64_t F = x_in.size(0);
  const auto dt = dtype();
  const auto dev = device();
  const int64_t D = c.dim, H = c.num_heads, d = c.head_dim(), gh = c.grid_h(), gw = c.grid_w(), P = gh * gw;
  const int64_t n = F * P, Cin = c.in_dim;
  at::Tensor t = t_in.to(dev, at::kFloat);
  if (t.dim() == 0) t = t.expand({F});
  WM_CHECK(t.dim() == 1 && t.size(0) == F, "timesteps must be a scalar or [", F, "], got ", t_in.sizes());
  check_context(c, ctx);

  // Patchify [F, 36, gh*2, gw*2] -> [n, 36*2*2] in Conv3d weight order (C, pt, ph, pw).
  at::Tensor xin = at::cat({x_in.to(dev, dt), cond.to(dev, dt)}, 1);
  at::Tensor patches =
      xin.reshape({F, Cin, gh, c.patch_h, gw, c.patch_w}).permute({0, 2, 4, 1, 3, 5}).reshape({n, -1});
  const at::Tensor& w0 = patch_embedding->weight;
  at::Tensor h = at::linear(patches, w0.reshape({D, -1}), patch_embedding->bias).unsqueeze(0);  // [1, n, D]

  at::Tensor e = time_embedding->forward(mg2_sinusoid(t, c.freq_dim).to(dt));  // [F, D]
  at::Tensor e0 = time_projection->forward(e).view({F, 6, D});
  const at::Tensor pos = positions(first_frame, F);

  if (kv_out) {
    kv_out->main.assign(c.num_layers, LayerKv{});
    kv_out->action = ActionKv{};
  }
  auto modulate = [&](const at::Tensor& x_, const at::Tensor& shift, const at::Tensor& scale) {
    return (plain_layer_norm(x_, c.eps).view({F, P, D}) * (1 + scale) + shift).view({1, n, D});
  };
  auto heads = [&](const at::Tensor& z, int64_t len) { return z.view({len, H, d}).transpose(0, 1); };  // [H, len, d]
  size_t action_slot = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    auto& blk = *blocks->ptr(l)->as<Mg2BlockImpl>();
    auto& sa = *blk.self_attn;
    at::Tensor m = blk.modulation.to(dt) + e0;                          // [F, 6, D]
    auto mod = [&](int i) { return m.select(1, i).unsqueeze(1); };      // [F, 1, D]

    at::Tensor y = modulate(h, mod(0), mod(1));
    at::Tensor q = sa.norm_q->forward(sa.q->forward(y)), k = sa.norm_k->forward(sa.k->forward(y));
    at::Tensor v = heads(sa.v->forward(y)[0], n).contiguous();
    q = apply_rope(heads(q[0], n), pos, rope_);
    k = apply_rope(heads(k[0], n), pos, rope_);
    if (kv_out) {
      LayerKv& kv = kv_out->main[l];
      kv.k = k;
      kv.v = v;
      kv.pos = pos;
      kv.logw = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(dev));
    }
    at::Tensor a = attend_in_context(l, q, k, v, ctx, dt, dev);
    a = sa.o->forward(a.transpose(0, 1).reshape({1, n, D}));
    h = h + (a.view({F, P, D}) * mod(2)).view({1, n, D});

    // Cross-attention to the CLIP tokens (no RoPE, no gate).
    auto& ca = *blk.cross_attn;
    at::Tensor cq = ca.norm_q->forward(ca.q->forward(affine_layer_norm(*blk.norm3, h)));
    at::Tensor ck = visual.k[l].to(dev, dt)[0], cv = visual.v[l].to(dev, dt)[0];
    at::Tensor co = attention(heads(cq[0], n), ck, cv, at::Tensor()).out;
    h = h + ca.o->forward(co.transpose(0, 1).reshape({1, n, D}));

    if (blk.action_model) {
      h = blk.action_model->forward(h, actions, first_frame, F, P, ctx.action, action_slot,
                                    kv_out ? &kv_out->action : nullptr);
      ++action_slot;
    }

    y = modulate(h, mod(3), mod(4));
    h = h + (blk.ffn->forward(y).view({F, P, D}) * mod(5)).view({1, n, D});
  }

  // Head: modulated by e itself (head.modulation + e), then unpatchify.
  at::Tensor mh = head->modulation.to(dt) + e.unsqueeze(1);  // [F, 2, D]
  at::Tensor y = modulate(h, mh.select(1, 0).unsqueeze(1), mh.select(1, 1).unsqueeze(1));
  at::Tensor out = head->head->forward(y)[0];  // [n, ph*pw*C]
  const int64_t C = c.out_dim;
  out = out.view({F, gh, gw, c.patch_h, c.patch_w, C}).permute({0, 5, 1, 3, 2, 4}).reshape(
      {F, C, gh * c.patch_h, gw * c.patch_w});
  return out.to(x_in.scalar_type());
}

}  // namespace wm::dit
