#include "dit/wan_layers.h"

#include <torch/nn/options/linear.h>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm::dit {
namespace nn = torch::nn;

WanRmsNormImpl::WanRmsNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor WanRmsNormImpl::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
  return y * weight.to(x.scalar_type());
}

WanAttentionImpl::WanAttentionImpl(int64_t dim, double eps) {
  q = register_module("q", nn::Linear(dim, dim));
  k = register_module("k", nn::Linear(dim, dim));
  v = register_module("v", nn::Linear(dim, dim));
  o = register_module("o", nn::Linear(dim, dim));
  norm_q = register_module("norm_q", WanRmsNorm(dim, eps));
  norm_k = register_module("norm_k", WanRmsNorm(dim, eps));
}

WanHeadImpl::WanHeadImpl(int64_t dim, int64_t patch_volume, int64_t out_dim) {
  head = register_module("head", nn::Linear(dim, patch_volume * out_dim));
  modulation = register_parameter("modulation", at::zeros({1, 2, dim}));
}

at::Tensor wan_plain_layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps).to(x.scalar_type());
}

at::Tensor wan_affine_layer_norm(const nn::LayerNormImpl& ln, const at::Tensor& x) {
  const auto& o = ln.options;
  return at::layer_norm(x.to(at::kFloat), o.normalized_shape(), ln.weight.to(at::kFloat), ln.bias.to(at::kFloat),
                        o.eps())
      .to(x.scalar_type());
}

at::Tensor wan_sinusoid(const at::Tensor& t, int64_t dim) {
  WM_CHECK(dim % 2 == 0, "dim must be even, got ", dim);
  const int64_t half = dim / 2;
  auto dopt = at::TensorOptions().dtype(at::kDouble).device(t.device());
  at::Tensor f = at::pow(10000.0, -at::arange(half, dopt) / double(half));
  at::Tensor ang = t.to(at::kDouble).unsqueeze(-1) * f;
  return at::cat({ang.cos(), ang.sin()}, -1);
}

at::Tensor wan_positions(int64_t first_frame, int64_t F, int64_t gh, int64_t gw) {
  const int64_t P = gh * gw;
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor t = at::arange(first_frame, first_frame + F, lo).view({F, 1}).expand({F, P});
  at::Tensor h = at::arange(gh, lo).view({gh, 1}).expand({gh, gw}).reshape({1, P}).expand({F, P});
  at::Tensor w = at::arange(gw, lo).view({1, gw}).expand({gh, gw}).reshape({1, P}).expand({F, P});
  return at::stack({t, h, w}, -1).reshape({F * P, 3}).contiguous();
}

at::Tensor wan_patch_embed(const nn::Conv3dImpl& conv, const at::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t F = x.size(0), C = x.size(1), gh = x.size(2) / ph, gw = x.size(3) / pw;
  WM_CHECK(gh * ph == x.size(2) && gw * pw == x.size(3), "latent grid ", x.size(2), " x ", x.size(3),
           " is not a multiple of the patch ", ph, " x ", pw);
  at::Tensor patches = x.reshape({F, C, gh, ph, gw, pw}).permute({0, 2, 4, 1, 3, 5}).reshape({F * gh * gw, -1});
  const at::Tensor& w = conv.weight;
  return at::linear(patches, w.reshape({w.size(0), -1}), conv.bias).unsqueeze(0);
}

at::Tensor wan_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  const int64_t n = x.size(1), D = x.size(2), G = scale.size(0);
  WM_CHECK(n % G == 0, "modulation of ", G, " rows does not divide ", n, " tokens");
  return (wan_plain_layer_norm(x, eps).view({G, n / G, D}) * (1 + scale) + shift).view({1, n, D});
}

at::Tensor wan_gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  const int64_t n = x.size(1), D = x.size(2), G = gate.size(0);
  return x + (y.view({G, n / G, D}) * gate).view({1, n, D});
}

namespace {

// Layer l's attention of the chunk's q over its k, v [H, n, d] and the context's: the window's
// (k, v staged into it), or the earlier K/V prepended. Returns [H, n, d] in dt.
at::Tensor attend_in_context(int l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const WanKvContext& ctx, at::ScalarType dt, at::Device dev) {
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

at::Tensor wan_self_attention(WanAttentionImpl& sa, const at::Tensor& y, const WanTokens& tok, int layer,
                              const WanKvContext& ctx, LayerKv* kv_out) {
  const int64_t n = tok.n, H = tok.heads, d = tok.head_dim;
  auto heads = [&](const at::Tensor& z) { return z[0].view({n, H, d}).transpose(0, 1); };  // [H, n, d]
  at::Tensor q = apply_rope(heads(sa.norm_q->forward(sa.q->forward(y))), tok.pos, *tok.rope);
  at::Tensor k = apply_rope(heads(sa.norm_k->forward(sa.k->forward(y))), tok.pos, *tok.rope);
  at::Tensor v = heads(sa.v->forward(y)).contiguous();
  if (kv_out) {
    kv_out->k = k;
    kv_out->v = v;
    kv_out->pos = tok.pos;
    kv_out->logw = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(y.device()));
  }
  at::Tensor a = attend_in_context(layer, q, k, v, ctx, y.scalar_type(), y.device());
  return sa.o->forward(a.transpose(0, 1).reshape({1, n, tok.dim}));
}

at::Tensor wan_cross_attention(WanAttentionImpl& ca, const at::Tensor& x, const at::Tensor& k, const at::Tensor& v,
                               const WanTokens& tok) {
  const int64_t n = tok.n;
  at::Tensor q = ca.norm_q->forward(ca.q->forward(x))[0].view({n, tok.heads, tok.head_dim}).transpose(0, 1);
  const auto dt = x.scalar_type();
  at::Tensor o = attention(q, k.to(x.device(), dt)[0], v.to(x.device(), dt)[0], at::Tensor()).out;
  return ca.o->forward(o.transpose(0, 1).reshape({1, n, tok.dim}));
}

std::pair<at::Tensor, at::Tensor> wan_cross_kv(WanAttentionImpl& ca, const at::Tensor& ctx, int64_t heads) {
  const int64_t L = ctx.size(1), D = ctx.size(2), d = D / heads;
  at::Tensor k = ca.norm_k->forward(ca.k->forward(ctx)).view({1, L, heads, d}).transpose(1, 2).contiguous();
  at::Tensor v = ca.v->forward(ctx).view({1, L, heads, d}).transpose(1, 2).contiguous();
  return {k, v};
}

at::Tensor wan_head(WanHeadImpl& head, const at::Tensor& h, const at::Tensor& e, const WanTokens& tok, int64_t gh,
                    int64_t gw, int64_t ph, int64_t pw, int64_t C) {
  at::Tensor mh = head.modulation.to(h.scalar_type()) + e.unsqueeze(1);  // [G, 2, D]
  at::Tensor y = wan_modulate(h, wan_mod(mh, 0), wan_mod(mh, 1), tok.eps);
  at::Tensor out = head.head->forward(y)[0];  // [n, ph * pw * C]
  return out.view({tok.F, gh, gw, ph, pw, C}).permute({0, 5, 1, 3, 2, 4}).reshape({tok.F, C, gh * ph, gw * pw});
}

}  // namespace wm::dit
