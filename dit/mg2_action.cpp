#include "dit/mg2_action.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/options/normalization.h>

#include <cmath>

#include "runtime/error.h"

namespace wm::dit {
namespace nn = torch::nn;

namespace {

// x * rsqrt(mean(x^2) + 1e-6) in x's own dtype (upstream's action-module RMSNorm: no weight, no upcast).
at::Tensor rms_plain(const at::Tensor& x) { return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6); }

// Rotates the first `channels` channels of x [..., F, H, D] (frame axis at -3) by positions pos [F]
// (float32 angles, as upstream's table), interleaved pairs.
at::Tensor rotate_frames(const at::Tensor& x, const at::Tensor& pos, int64_t channels, double theta) {
  const int64_t F = x.size(-3), half = channels / 2, D = x.size(-1);
  WM_CHECK(pos.numel() == F, "positions ", pos.numel(), " for ", F, " frames");
  WM_CHECK(channels % 2 == 0 && channels <= D, "rotated channels ", channels, " must be even and <= ", D);
  auto fo = at::TensorOptions().dtype(at::kFloat).device(x.device());
  at::Tensor freqs = 1.0 / at::pow(at::scalar_tensor(theta, fo), at::arange(0, channels, 2, fo) / double(channels));
  at::Tensor ang = pos.to(x.device(), at::kFloat).view({F, 1}) * freqs.view({1, half});  // [F, half]
  at::Tensor c = ang.cos().view({F, 1, half}), s = ang.sin().view({F, 1, half});
  at::Tensor xf = x.to(at::kFloat);
  auto shape = xf.sizes().vec();
  shape.back() = half;
  shape.push_back(2);
  at::Tensor pr = xf.narrow(-1, 0, channels).reshape(shape);
  at::Tensor a = pr.select(-1, 0), b = pr.select(-1, 1);
  at::Tensor r = at::stack({a * c - b * s, b * c + a * s}, -1).flatten(-2);
  at::Tensor out = channels == D ? r : at::cat({r, xf.narrow(-1, channels, D - channels)}, -1);
  return out.to(x.scalar_type());
}

// softmax(q k^T / sqrt(d)) v over the last two dims: q [..., n_q, d], k, v [..., n_k, d].
at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
  return at::matmul(at::softmax(s.to(at::kFloat), -1).to(v.scalar_type()), v);
}

at::Tensor cat_frames(const at::Tensor& ctx, const at::Tensor& cur, int64_t dim) {
  if (!ctx.defined() || ctx.size(dim) == 0) return cur;
  return at::cat({ctx.to(cur.device(), cur.scalar_type()), cur}, dim);
}

}  // namespace

int64_t ActionKv::n_frames() const {
  if (!kb_k.empty()) return kb_k[0].size(0);
  if (!ms_k.empty()) return ms_k[0].size(1);
  return 0;
}

size_t ActionKv::nbytes() const {
  size_t n = 0;
  for (const auto* list : {&kb_k, &kb_v, &ms_k, &ms_v})
    for (const auto& t : *list) n += t.defined() ? t.numel() * t.element_size() : 0;
  return n;
}

ActionKv ActionKv::cat(const std::vector<const ActionKv*>& parts) {
  ActionKv out;
  std::vector<const ActionKv*> p;
  for (const auto* a : parts)
    if (a && !a->empty() && a->n_frames() > 0) p.push_back(a);
  if (p.empty()) return out;
  const size_t nk = p[0]->kb_k.size(), nm = p[0]->ms_k.size();
  for (const auto* a : p)
    WM_CHECK(a->kb_k.size() == nk && a->ms_k.size() == nm, "action K/V of different layouts: ", a->kb_k.size(), "/",
             a->ms_k.size(), " layers against ", nk, "/", nm);
  auto join = [&](std::vector<at::Tensor> ActionKv::*field, size_t n, int64_t dim, std::vector<at::Tensor>& dst) {
    for (size_t l = 0; l < n; ++l) {
      std::vector<at::Tensor> ts;
      for (const auto* a : p) ts.push_back((a->*field)[l]);
      dst.push_back(ts.size() == 1 ? ts[0] : at::cat(ts, dim));
    }
  };
  join(&ActionKv::kb_k, nk, 0, out.kb_k);
  join(&ActionKv::kb_v, nk, 0, out.kb_v);
  join(&ActionKv::ms_k, nm, 1, out.ms_k);
  join(&ActionKv::ms_v, nm, 1, out.ms_v);
  return out;
}

ActionKv ActionKv::last_frames(int64_t n) const {
  const int64_t have = n_frames(), keep = std::min(n, have);
  ActionKv out;
  for (const auto& t : kb_k) out.kb_k.push_back(t.narrow(0, have - keep, keep).contiguous());
  for (const auto& t : kb_v) out.kb_v.push_back(t.narrow(0, have - keep, keep).contiguous());
  for (const auto& t : ms_k) out.ms_k.push_back(t.narrow(1, have - keep, keep).contiguous());
  for (const auto& t : ms_v) out.ms_v.push_back(t.narrow(1, have - keep, keep).contiguous());
  return out;
}

ActionKv ActionKv::to(at::Device device) const {
  ActionKv out;
  auto mv = [&](const std::vector<at::Tensor>& src, std::vector<at::Tensor>& dst) {
    for (const auto& t : src) dst.push_back(t.to(device, /*non_blocking=*/false, /*copy=*/true));
  };
  mv(kb_k, out.kb_k);
  mv(kb_v, out.kb_v);
  mv(ms_k, out.ms_k);
  mv(ms_v, out.ms_v);
  return out;
}

ActionKv ActionKv::reanchored(int64_t delta, const Mg2ActionConfig& a) const {
  ActionKv out = *this;
  if (delta == 0) return out;
  auto rot = [&](const at::Tensor& k, int64_t channels) {
    const int64_t F = k.size(-3);
    at::Tensor pos = at::full({F}, double(delta), at::TensorOptions().dtype(at::kFloat));
    return rotate_frames(k, pos, channels, a.rope_theta);
  };
  for (auto& k : out.kb_k) k = rot(k, a.rope_dim_list[0]);
  for (auto& k : out.ms_k) k = rot(k, a.mouse_qk_dim_list[0]);
  return out;
}

Mg2UnusedWeightImpl::Mg2UnusedWeightImpl(int64_t dim) { weight = register_parameter("weight", at::ones({dim})); }

Mg2ActionModuleImpl::Mg2ActionModuleImpl(const Mg2ActionConfig& a, int64_t dim) : cfg(a) {
  auto lin = [&](int64_t in, int64_t out, bool bias) { return nn::Linear(nn::LinearOptions(in, out).bias(bias)); };
  if (a.enable_keyboard) {
    keyboard_embed = register_module(
        "keyboard_embed", nn::Sequential(lin(a.keyboard_dim_in, a.hidden_size, true), nn::SiLU(),
                                         lin(a.hidden_size, a.hidden_size, true)));
  }
  if (a.enable_mouse) {
    const int64_t c = a.mouse_hidden_dim;
    mouse_mlp = register_module(
        "mouse_mlp",
        nn::Sequential(lin(int64_t(a.mouse_dim_in) * a.window_frames() + dim, c, true),
                       nn::GELU(nn::GELUOptions().approximate("tanh")), lin(c, c, true),
                       nn::LayerNorm(nn::LayerNormOptions({c}).eps(1e-5))));
    t_qkv = register_module("t_qkv", lin(c, 3 * c, a.qkv_bias));
    if (a.qk_norm) {
      img_attn_q_norm = register_module("img_attn_q_norm", Mg2UnusedWeight(a.mouse_head_dim()));
      img_attn_k_norm = register_module("img_attn_k_norm", Mg2UnusedWeight(a.mouse_head_dim()));
    }
    proj_mouse = register_module("proj_mouse", lin(c, dim, a.qkv_bias));
  }
  if (a.enable_keyboard) {
    if (a.qk_norm) {
      key_attn_q_norm = register_module("key_attn_q_norm", Mg2UnusedWeight(a.keyboard_head_dim()));
      key_attn_k_norm = register_module("key_attn_k_norm", Mg2UnusedWeight(a.keyboard_head_dim()));
    }
    mouse_attn_q = register_module("mouse_attn_q", lin(dim, a.keyboard_hidden_dim, a.qkv_bias));
    keyboard_attn_kv = register_module(
        "keyboard_attn_kv", lin(int64_t(a.hidden_size) * a.window_frames(), 2 * int64_t(a.keyboard_hidden_dim),
                                a.qkv_bias));
    proj_keyboard = register_module("proj_keyboard", lin(a.keyboard_hidden_dim, dim, a.qkv_bias));
  }
}

at::Tensor mg2_action_window(const Mg2ActionConfig& a, int64_t first_frame, int64_t F, int64_t n_video_frames) {
  const int64_t r = a.vae_time_compression_ratio, W = a.window_frames();
  const int64_t need = std::max<int64_t>(1, r * (first_frame + F - 1));
  WM_CHECK(n_video_frames >= need, "latent frames ", first_frame, "..", first_frame + F - 1, " read video frames up to ",
           need - 1, " but the actions hold ", n_video_frames, " frames");
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor j = at::arange(first_frame, first_frame + F, lo).view({F, 1});
  at::Tensor w = at::arange(W, lo).view({1, W});
  return (j * r - W + w).clamp_min(0);
}

at::Tensor mg2_action_rope(const at::Tensor& x, int64_t first_frame, int64_t channels, double theta) {
  const int64_t F = x.size(-3);
  at::Tensor pos = at::arange(first_frame, first_frame + F, at::TensorOptions().dtype(at::kFloat));
  return rotate_frames(x, pos, channels, theta);
}

at::Tensor Mg2ActionModuleImpl::forward(const at::Tensor& x, const Mg2Actions& actions, int64_t first_frame, int64_t F,
                                        int64_t S, const ActionKv* ctx, size_t slot, ActionKv* out) {
  const auto& a = cfg;
  WM_CHECK(x.dim() == 3 && x.size(0) == 1 && x.size(1) == F * S, "hidden states must be [1, ", F * S, ", dim], got ",
           x.sizes());
  const auto dt = x.scalar_type();
  const auto dev = x.device();
  const int64_t C = x.size(2), W = a.window_frames();
  at::Tensor h = x;

  if (a.enable_mouse) {
    WM_CHECK(actions.mouse.defined() && actions.mouse.dim() == 2 && actions.mouse.size(1) == a.mouse_dim_in,
             "the model's mouse branch needs mouse actions [Nv, ", a.mouse_dim_in, "], got ",
             actions.mouse.defined() ? actions.mouse.sizes() : at::IntArrayRef{});
    at::Tensor idx = mg2_action_window(a, first_frame, F, actions.mouse.size(0)).to(dev);
    // [F, 12, 2] -> [F, 24] window-major, the same for every spatial token.
    at::Tensor g = actions.mouse.to(dev, dt).index_select(0, idx.flatten()).view({F, W * a.mouse_dim_in});
    at::Tensor hs = x.view({F, S, C}).transpose(0, 1);  // [S, F, C]
    at::Tensor feat = at::cat({hs, g.unsqueeze(0).expand({S, F, W * a.mouse_dim_in})}, -1);
    at::Tensor qkv = t_qkv->forward(mouse_mlp->forward(feat));  // [S, F, 3c]
    const int64_t H = a.heads_num, D = a.mouse_head_dim();
    qkv = qkv.view({S, F, 3, H, D});
    at::Tensor q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2).contiguous();
    if (a.qk_norm) {
      q = rms_plain(q);
      k = rms_plain(k);
    }
    q = mg2_action_rope(q, first_frame, a.mouse_qk_dim_list[0], a.rope_theta);
    k = mg2_action_rope(k, first_frame, a.mouse_qk_dim_list[0], a.rope_theta);
    if (out) {
      out->ms_k.resize(std::max(out->ms_k.size(), slot + 1));
      out->ms_v.resize(std::max(out->ms_v.size(), slot + 1));
      out->ms_k[slot] = k;
      out->ms_v[slot] = v;
    }
    at::Tensor kk = k, vv = v;
    if (ctx && slot < ctx->ms_k.size()) {
      kk = cat_frames(ctx->ms_k[slot], k, 1);
      vv = cat_frames(ctx->ms_v[slot], v, 1);
    }
    // Per spatial token: [S, H, F, D] over [S, H, n, D].
    at::Tensor o = plain_attention(q.permute({0, 2, 1, 3}), kk.permute({0, 2, 1, 3}), vv.permute({0, 2, 1, 3}));
    o = o.permute({2, 0, 1, 3}).reshape({1, F * S, H * D});  // (T S) order
    h = x + proj_mouse->forward(o);
  }

  if (a.enable_keyboard) {
    WM_CHECK(actions.keyboard.defined() && actions.keyboard.dim() == 2 && actions.keyboard.size(1) == a.keyboard_dim_in,
             "the model needs keyboard actions [Nv, ", a.keyboard_dim_in, "], got ",
             actions.keyboard.defined() ? actions.keyboard.sizes() : at::IntArrayRef{});
    const auto wdt = keyboard_embed->ptr<nn::LinearImpl>(0)->weight.scalar_type();
    at::Tensor idx = mg2_action_window(a, first_frame, F, actions.keyboard.size(0)).to(dev);
    at::Tensor kb = keyboard_embed->forward(actions.keyboard.to(dev, wdt).index_select(0, idx.flatten()));
    at::Tensor kv = keyboard_attn_kv->forward(kb.reshape({F, W * a.hidden_size}));  // [F, 2 kh]
    const int64_t H = a.heads_num, D = a.keyboard_head_dim();
    kv = kv.view({F, 2, H, D});
    at::Tensor k = kv.select(1, 0), v = kv.select(1, 1).contiguous();
    at::Tensor q = mouse_attn_q->forward(h).view({F, S, H, D});
    if (a.qk_norm) {
      q = rms_plain(q);
      k = rms_plain(k);
    }
    // q's frame axis must sit at -3: [S, F, H, D].
    q = mg2_action_rope(q.transpose(0, 1), first_frame, a.rope_dim_list[0], a.rope_theta).transpose(0, 1);
    k = mg2_action_rope(k, first_frame, a.rope_dim_list[0], a.rope_theta);
    if (out) {
      out->kb_k.resize(std::max(out->kb_k.size(), slot + 1));
      out->kb_v.resize(std::max(out->kb_v.size(), slot + 1));
      out->kb_k[slot] = k;
      out->kb_v[slot] = v;
    }
    at::Tensor kk = k, vv = v;
    if (ctx && slot < ctx->kb_k.size()) {
      kk = cat_frames(ctx->kb_k[slot], k, 0);
      vv = cat_frames(ctx->kb_v[slot], v, 0);
    }
    // Every token over the same keys: [H, F*S, D] over [H, n, D].
    at::Tensor o = plain_attention(q.reshape({F * S, H, D}).transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1));
    o = o.transpose(0, 1).reshape({1, F * S, H * D});
    h = h + proj_keyboard->forward(o);
  }
  return h;
}

}  // namespace wm::dit
