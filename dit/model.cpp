#include "dit/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/options/conv.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm::dit {
namespace nn = torch::nn;

namespace {

nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return nn::Sequential(nn::Linear(in, hidden), nn::SiLU(), nn::Linear(hidden, out));
}

// LayerNorm without affine parameters, in float32 (Wan's WanLayerNorm(elementwise_affine=False)).
at::Tensor layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps);
}

// Brings cond to [B, T, k] on device (zeros if undefined); names the field in errors.
at::Tensor batch_cond(const at::Tensor& c, int64_t B, int64_t T, int64_t k, const char* what, at::Device dev) {
  if (!c.defined()) return at::zeros({B, T, k}, at::TensorOptions().dtype(at::kFloat).device(dev));
  at::Tensor x = c.dim() == 2 ? c.unsqueeze(0) : c;
  WM_CHECK(x.dim() == 3 && x.size(1) == T && x.size(2) == k && (x.size(0) == B || x.size(0) == 1), what,
           " must be [", T, ", ", k, "] or [", B, ", ", T, ", ", k, "], got ", c.sizes());
  return x.to(dev, at::kFloat).expand({B, T, k});
}

}  // namespace

RmsNormImpl::RmsNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return (y * weight.to(at::kFloat)).to(x.scalar_type());
}

SelfAttentionImpl::SelfAttentionImpl(const DitConfig& c) {
  q = register_module("q", nn::Linear(c.dim, c.dim));
  k = register_module("k", nn::Linear(c.dim, c.dim));
  v = register_module("v", nn::Linear(c.dim, c.dim));
  o = register_module("o", nn::Linear(c.dim, c.dim));
  if (c.qk_norm) {
    norm_q = register_module("norm_q", RmsNorm(c.dim, c.eps));
    norm_k = register_module("norm_k", RmsNorm(c.dim, c.eps));
  }
}

DitBlockImpl::DitBlockImpl(const DitConfig& c) {
  self_attn = register_module("self_attn", SelfAttention(c));
  ffn = register_module("ffn", nn::Sequential(nn::Linear(c.dim, c.ffn_dim),
                                              nn::GELU(nn::GELUOptions().approximate("tanh")),
                                              nn::Linear(c.ffn_dim, c.dim)));
  modulation = register_parameter("modulation", at::randn({1, 6, c.dim}) / std::sqrt(double(c.dim)));
}

HeadImpl::HeadImpl(const DitConfig& c) {
  head = register_module("head", nn::Linear(c.dim, c.patch_dim()));
  modulation = register_parameter("modulation", at::randn({1, 2, c.dim}) / std::sqrt(double(c.dim)));
}

CausalDitImpl::CausalDitImpl(DitConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  const auto& c = cfg_;
  patch_embedding = register_module(
      "patch_embedding", nn::Conv3d(nn::Conv3dOptions(c.latent_channels, c.dim, {c.patch_t, c.patch_h, c.patch_w})
                                        .stride({c.patch_t, c.patch_h, c.patch_w})));
  time_embedding = register_module("time_embedding", mlp(c.freq_dim, c.dim, c.dim));
  time_projection = register_module("time_projection", nn::Sequential(nn::SiLU(), nn::Linear(c.dim, 6 * c.dim)));
  const int64_t hidden = c.cond.hidden > 0 ? c.cond.hidden : c.dim;
  const int64_t nf = n_camera_features(c.cond);
  if (c.cond.pose) pose_embedding = register_module("pose_embedding", mlp(nf, hidden, c.dim));
  if (c.cond.action_dim > 0)
    action_embedding = register_module("action_embedding", mlp(c.cond.action_dim, hidden, c.dim));
  if (c.cond.ray_embedding) ray_embedding = register_module("ray_embedding", mlp(nf, hidden, c.dim));
  if (c.cond.warp_reference)
    reference_embedding = register_module(
        "reference_embedding",
        nn::Linear(nn::LinearOptions((c.latent_channels + 1) * c.patch_t * c.patch_h * c.patch_w, c.dim).bias(false)));
  blocks = register_module("blocks", nn::ModuleList());
  for (int l = 0; l < c.n_layers; ++l) blocks->push_back(DitBlock(c));
  head = register_module("head", Head(c));
}

KvSpec CausalDitImpl::kv_spec(at::Device device, at::ScalarType dtype) const {
  KvSpec s;
  s.n_layers = cfg_.n_layers;
  s.n_kv_heads = cfg_.n_heads;
  s.head_dim = cfg_.head_dim;
  s.dtype = dtype;
  s.device = device;
  s.rope = cfg_.rope;
  return s;
}

at::Tensor CausalDitImpl::positions(const at::Tensor& frame_index) const {
  WM_CHECK(frame_index.dim() == 1, "frame_index must be [T], got ", frame_index.sizes());
  const int64_t T = frame_index.size(0), gh = cfg_.grid_h(), gw = cfg_.grid_w(), P = gh * gw;
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor t = frame_index.to(at::kCPU, at::kLong).view({T, 1}).expand({T, P});
  at::Tensor h = at::arange(gh, lo).view({gh, 1}).expand({gh, gw}).reshape({1, P}).expand({T, P});
  at::Tensor w = at::arange(gw, lo).view({1, gw}).expand({gh, gw}).reshape({1, P}).expand({T, P});
  return at::stack({t, h, w}, -1).reshape({T * P, 3}).contiguous();
}

at::Tensor sinusoidal_embedding(const at::Tensor& t, int64_t dim) {
  WM_CHECK(dim % 2 == 0, "dim must be even, got ", dim);
  const int64_t half = dim / 2;
  auto dopt = at::TensorOptions().dtype(at::kDouble).device(t.device());
  at::Tensor f = at::pow(10000.0, -at::arange(half, dopt) / double(half));
  at::Tensor ang = t.to(at::kDouble).unsqueeze(-1) * f;
  return at::cat({ang.cos(), ang.sin()}, -1).to(at::kFloat);
}

template <class Attend>
at::Tensor CausalDitImpl::run(const at::Tensor& x, const at::Tensor& t, const FrameCond& cond,
                              const at::Tensor& frame_index, Attend&& attend, std::vector<LayerKv>* kv_out) {
  const auto& c = cfg_;
  WM_CHECK(x.dim() == 5 && x.size(2) == c.latent_channels && x.size(3) == c.latent_height &&
               x.size(4) == c.latent_width,
           "latents must be [B, T, ", c.latent_channels, ", ", c.latent_height, ", ", c.latent_width, "], got ",
           x.sizes());
  const int64_t B = x.size(0), T = x.size(1), D = c.dim, H = c.n_heads, d = c.head_dim;
  const int64_t gh = c.grid_h(), gw = c.grid_w(), P = gh * gw, n = T * P;
  WM_CHECK(t.dim() == 2 && t.size(0) == B && t.size(1) == T, "timesteps must be [", B, ", ", T, "], got ", t.sizes());
  const auto dt = patch_embedding->weight.scalar_type();
  const auto dev = patch_embedding->weight.device();

  at::Tensor ref;  // [B or 1, T, C + 1, h, w] when given
  at::Tensor h = embed_patches(x, cond, &ref);  // [B, n, D]

  at::Tensor pose;
  const int64_t yaw_pairs = c.cond.yaw_rope_pairs;
  if (c.cond.pose || c.cond.ray_embedding || yaw_pairs > 0) pose = batch_cond(cond.pose, B, T, 3, "pose", dev);
  const at::Tensor ray_yaw = yaw_pairs > 0 ? token_ray_yaw_deg(pose, c.cond, gh, gw) : at::Tensor();  // [B, n]
  if (c.cond.ray_embedding) {
    at::Tensor rf = ray_embedding->forward(ray_features(pose, c.cond, gw).to(dt));  // [B, T, gw, D]
    h = (h.view({B, T, gh, gw, D}) + rf.unsqueeze(2)).view({B, n, D});
  }

  // Per-frame embedding e [B, T, D] and the six modulations e0 [B, T, 6, D].
  at::Tensor e = time_embedding->forward(sinusoidal_embedding(t.to(dev) * c.timestep_scale, c.freq_dim).to(dt));
  if (c.cond.pose) e = e + pose_embedding->forward(pose_features(pose, c.cond).to(dt));
  if (c.cond.action_dim > 0)
    e = e + action_embedding->forward(batch_cond(cond.action, B, T, c.cond.action_dim, "action", dev).to(dt));
  at::Tensor e0 = time_projection->forward(e).view({B, T, 6, D}).to(at::kFloat);

  const at::Tensor pos = positions(frame_index.to(at::kCPU));
  if (kv_out) {
    WM_CHECK(B == 1, "kv_out needs batch 1, got ", B);
    kv_out->assign(c.n_layers, LayerKv{});
  }
  // Modulated LayerNorm: LN(x) * (1 + scale) + shift, per frame; [B, n, D] in dt.
  auto modulate = [&](const at::Tensor& x_, const at::Tensor& shift, const at::Tensor& scale) {
    return (layer_norm(x_, c.eps).view({B, T, P, D}) * (1 + scale) + shift).view({B, n, D}).to(dt);
  };
  auto gated = [&](const at::Tensor& y, const at::Tensor& gate) {
    return (y.view({B, T, P, D}).to(at::kFloat) * gate).view({B, n, D}).to(dt);
  };
  for (int l = 0; l < c.n_layers; ++l) {
    auto& blk = *blocks->ptr(l)->as<DitBlockImpl>();
    auto& sa = *blk.self_attn;
    at::Tensor m = blk.modulation.to(at::kFloat).unsqueeze(0) + e0;  // [B, T, 6, D]
    auto mod = [&](int i) { return m.select(2, i).unsqueeze(2); };    // [B, T, 1, D]

    at::Tensor y = modulate(h, mod(0), mod(1));
    at::Tensor q = sa.q->forward(y), k = sa.k->forward(y), v = sa.v->forward(y);
    if (c.qk_norm) {
      q = sa.norm_q->forward(q);
      k = sa.norm_k->forward(k);
    }
    auto heads = [&](const at::Tensor& z) { return z.view({B, n, H, d}).transpose(1, 2); };  // [B, H, n, d]
    q = apply_rope(heads(q), pos, c.rope);
    k = apply_rope(heads(k), pos, c.rope);
    if (yaw_pairs > 0) {
      q = apply_yaw_rope(q, ray_yaw, c.rope.rotated_channels(), yaw_pairs);
      k = apply_yaw_rope(k, ray_yaw, c.rope.rotated_channels(), yaw_pairs);
    }
    v = heads(v).contiguous();
    if (kv_out) {
      LayerKv& kv = (*kv_out)[l];
      kv.k = k[0];
      kv.v = v[0];
      kv.pos = pos;
      kv.logw = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(dev));
    }
    at::Tensor a = attend(l, q, k, v);  // [B, H, n, d]
    a = sa.o->forward(a.transpose(1, 2).reshape({B, n, D}));
    h = h + gated(a, mod(2));

    y = modulate(h, mod(3), mod(4));
    h = h + gated(blk.ffn->forward(y), mod(5));
  }

  // Head: its own two modulations from e.
  at::Tensor mh = head->modulation.to(at::kFloat).unsqueeze(0) + e.to(at::kFloat).unsqueeze(2);  // [B, T, 2, D]
  return predict(modulate(h, mh.select(2, 0).unsqueeze(2), mh.select(2, 1).unsqueeze(2)), x, t, ref);
}

at::Tensor CausalDitImpl::embed_patches(const at::Tensor& x, const FrameCond& cond, at::Tensor* ref) {
  const auto& c = cfg_;
  const int64_t B = x.size(0), T = x.size(1), D = c.dim, C = c.latent_channels;
  const int64_t gh = c.grid_h(), gw = c.grid_w(), n = T * gh * gw, ph = c.patch_h, pw = c.patch_w;
  const at::Tensor& w0 = patch_embedding->weight;
  const auto dt = w0.scalar_type();
  const auto dev = w0.device();
  // Patchify [B, T, C, gh*ph, gw*pw] -> [B, n, C*ph*pw] in Conv3d weight order (C, pt, ph, pw).
  auto patchify = [&](const at::Tensor& z, int64_t ch) {
    return z.reshape({B, T, ch, gh, ph, gw, pw}).permute({0, 1, 3, 5, 2, 4, 6}).reshape({B, n, ch * ph * pw});
  };
  at::Tensor h = at::linear(patchify(x.to(dev, dt), C), w0.reshape({D, -1}), patch_embedding->bias);  // [B, n, D]
  if (c.cond.warp_reference && cond.reference.defined()) {
    // The reference frames and their mask, patchified alike, through their own embedding.
    at::Tensor& r = *ref;
    r = cond.reference.to(dev, dt);
    if (r.dim() == 4) r = r.unsqueeze(0);
    WM_CHECK(r.dim() == 5 && (r.size(0) == B || r.size(0) == 1) && r.size(1) == T && r.size(2) == C + 1 &&
                 r.size(3) == x.size(3) && r.size(4) == x.size(4),
             "reference must be [", T, ", ", C + 1, ", ", x.size(3), ", ", x.size(4), "] or [", B, ", ", T, ", ..], got ",
             cond.reference.sizes());
    h = h + reference_embedding->forward(patchify(r.expand({B, T, C + 1, x.size(3), x.size(4)}), C + 1));
  }
  return h;
}

at::Tensor CausalDitImpl::predict(const at::Tensor& y, const at::Tensor& x, const at::Tensor& t,
                                  const at::Tensor& ref) {
  const auto& c = cfg_;
  const int64_t B = x.size(0), T = x.size(1), C = c.latent_channels;
  const int64_t gh = c.grid_h(), gw = c.grid_w(), ph = c.patch_h, pw = c.patch_w;
  // Unpatchify (channels ordered ph, pw, C).
  at::Tensor out = head->head->forward(y);  // [B, n, ph*pw*C]
  out = out.view({B, T, gh, gw, ph, pw, C}).permute({0, 1, 6, 2, 4, 3, 5}).reshape({B, T, C, gh * ph, gw * pw});
  if (c.prediction == Prediction::V) return out;
  // A reference_residual head draws the difference from the turned frame (zero where unseen).
  if (c.cond.reference_residual && ref.defined()) out = out.to(at::kFloat) + ref.narrow(2, 0, C).to(at::kFloat);
  // x0 head: the velocity that takes x_t to that x0, v = (x_t - x0) / t.
  at::Tensor tt = t.to(at::kFloat).clamp_min(kMinPredictionT).view({B, T, 1, 1, 1});
  return (x.to(at::kFloat) - out.to(at::kFloat)) / tt;
}

// Timesteps as [B, T] float on dev from a scalar, [T] or [B, T].
static at::Tensor batch_t(const at::Tensor& t, int64_t B, int64_t T, at::Device dev) {
  WM_CHECK(t.defined(), "timesteps are undefined");
  at::Tensor x = t.to(dev, at::kFloat);
  if (x.dim() == 0) return x.expand({B, T});
  if (x.dim() == 1) {
    WM_CHECK(x.size(0) == T, "timesteps must be a scalar, [", T, "] or [", B, ", ", T, "], got ", t.sizes());
    return x.unsqueeze(0).expand({B, T});
  }
  WM_CHECK(x.dim() == 2 && x.size(1) == T && (x.size(0) == B || x.size(0) == 1), "timesteps must be a scalar, [", T,
           "] or [", B, ", ", T, "], got ", t.sizes());
  return x.expand({B, T});
}

at::Tensor CausalDitImpl::forward_chunk(const at::Tensor& x_t, const at::Tensor& t, const FrameCond& cond,
                                        int64_t first_frame, KvWindow* window, std::vector<LayerKv>* kv_out) {
  WM_CHECK(x_t.dim() == 4, "chunk latents must be [F, C, h, w], got ", x_t.sizes());
  const int64_t F = x_t.size(0);
  WM_CHECK(first_frame >= 0, "first_frame must be >= 0, got ", first_frame);
  const auto dev = patch_embedding->weight.device();
  if (window) {
    const KvSpec& ws = window->spec();
    WM_CHECK(ws.n_layers == cfg_.n_layers && ws.n_kv_heads == cfg_.n_heads && ws.head_dim == cfg_.head_dim,
             "window holds ", ws.n_layers, " layers x ", ws.n_kv_heads, " heads x ", ws.head_dim, ", the model ",
             cfg_.n_layers, " x ", cfg_.n_heads, " x ", cfg_.head_dim);
    WM_CHECK(ws.device == dev, "window is on ", ws.device, ", the model on ", dev);
  }
  at::Tensor fi = at::arange(first_frame, first_frame + F, at::TensorOptions().dtype(at::kLong));
  auto attend = [&](int l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) -> at::Tensor {
    if (!window) return attention(q, k, v, at::Tensor()).out;
    KvWindow::Staged st = window->stage(l, k[0], v[0]);
    AttentionOptions o;
    o.n_window = st.n_window;
    return attention(q[0].to(st.k.scalar_type()), st.k, st.v, st.logw, o).out.to(q.scalar_type()).unsqueeze(0);
  };
  at::Tensor out = run(x_t.unsqueeze(0), batch_t(t, 1, F, dev), cond, fi, attend, kv_out);
  return out.squeeze(0).to(x_t.scalar_type());
}

at::Tensor CausalDitImpl::forward_sequence(const at::Tensor& x, const at::Tensor& t, const FrameCond& cond,
                                           const SequenceOptions& opt) {
  WM_CHECK(x.dim() == 4 || x.dim() == 5, "latents must be [T, C, h, w] or [B, T, C, h, w], got ", x.sizes());
  const bool batched = x.dim() == 5;
  at::Tensor xb = batched ? x : x.unsqueeze(0);
  const int64_t B = xb.size(0), T = xb.size(1), P = cfg_.tokens_per_frame(), n = T * P;
  const auto dev = patch_embedding->weight.device();
  at::Tensor fi = opt.frame_index.defined() ? opt.frame_index.to(at::kCPU, at::kLong)
                                            : at::arange(T, at::TensorOptions().dtype(at::kLong));
  WM_CHECK(fi.dim() == 1 && fi.size(0) == T, "frame_index must be [", T, "], got ", fi.sizes());
  FrameCond cb = cond;
  if (!batched) {
    if (cb.pose.defined() && cb.pose.dim() == 2) cb.pose = cb.pose.unsqueeze(0);
    if (cb.action.defined() && cb.action.dim() == 2) cb.action = cb.action.unsqueeze(0);
  }
  const int64_t bf = opt.block_frames > 0 ? opt.block_frames : cfg_.frames_per_chunk;
  at::Tensor key_logw = opt.key_logw.defined() ? opt.key_logw.to(dev, at::kFloat) : at::Tensor();
  WM_CHECK(!key_logw.defined() || (key_logw.dim() == 1 && key_logw.size(0) == n), "key_logw must be [", n, "], got ",
           key_logw.sizes());
  // The core's attention: block-causal over blocks of bf frames (each query block reads only the
  // keys it may see, no mask tensor), or the caller's dense bias [n, n] or [B, 1, n, n] in place
  // of that mask. Its autograd node keeps training cheap; libtorch 2.x runs it fused.
  AttentionOptions ao;
  if (opt.attn_bias.defined()) {
    ao.bias = opt.attn_bias.to(dev, at::kFloat);
    WM_CHECK((ao.bias.dim() == 2 && ao.bias.size(0) == n && ao.bias.size(1) == n) ||
                 (ao.bias.dim() == 4 && (ao.bias.size(0) == B || ao.bias.size(0) == 1) && ao.bias.size(1) == 1 &&
                  ao.bias.size(2) == n && ao.bias.size(3) == n),
             "attn_bias must be [", n, ", ", n, "] or [", B, ", 1, ", n, ", ", n, "], got ", ao.bias.sizes());
  } else {
    ao.mask.kind = AttentionMask::BlockCausal;
    ao.mask.block = bf * P;
  }
  auto attend = [&](int l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) -> at::Tensor {
    if (opt.attention) return opt.attention(l, q, k, v);
    return attention(q, k, v, key_logw, ao).out;
  };
  at::Tensor out = run(xb, batch_t(t, B, T, dev), cb, fi, attend, opt.kv_out);
  return (batched ? out : out.squeeze(0)).to(x.scalar_type());
}

void CausalDitImpl::init_weights(uint64_t seed, bool zero_head) {
  at::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto fill = [&](at::Tensor& p, auto&& draw) {
    at::Tensor tmp = at::empty(p.sizes(), at::TensorOptions().dtype(at::kFloat));
    draw(tmp);
    p.copy_(tmp);
  };
  auto xavier = [&](at::Tensor& w) {
    const double fan_out = double(w.size(0)), fan_in = double(w.numel() / w.size(0));
    const double b = std::sqrt(6.0 / (fan_in + fan_out));
    fill(w, [&](at::Tensor& x) { x.uniform_(-b, b, gen); });
  };
  auto normal = [&](at::Tensor& w, double std) { fill(w, [&](at::Tensor& x) { x.normal_(0.0, std, gen); }); };
  for (auto& item : named_parameters(true)) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool cond_embed = name.rfind("time_embedding.", 0) == 0 || name.rfind("pose_embedding.", 0) == 0 ||
                            name.rfind("action_embedding.", 0) == 0 || name.rfind("ray_embedding.", 0) == 0;
    const bool cond_out = (cond_embed && name.find(".2.") != std::string::npos && name.rfind("time_", 0) != 0) ||
                          name.rfind("reference_embedding.", 0) == 0;
    if (name.find("modulation") != std::string::npos) {
      normal(p, 1.0 / std::sqrt(double(cfg_.dim)));
    } else if (name.find("norm_") != std::string::npos) {
      p.fill_(1.0);
    } else if (is_bias) {
      p.zero_();
    } else if (zero_head && (name.rfind("head.head.", 0) == 0 || cond_out)) {
      p.zero_();
    } else if (cond_embed) {
      normal(p, 0.02);
    } else {
      xavier(p);
    }
  }
}

at::Tensor chunk_visibility_bias(const at::Tensor& visible, int64_t tokens_per_chunk, at::Device device) {
  WM_CHECK(visible.dim() == 2, "visibility must be [n_q_chunks, n_k_chunks], got ", visible.sizes());
  WM_CHECK(tokens_per_chunk > 0, "tokens_per_chunk must be > 0, got ", tokens_per_chunk);
  at::Tensor vis = visible.to(device, at::kBool);
  at::Tensor tok = vis.repeat_interleave(tokens_per_chunk, 0).repeat_interleave(tokens_per_chunk, 1);
  at::Tensor bias = at::zeros(tok.sizes(), at::TensorOptions().dtype(at::kFloat).device(device));
  return bias.masked_fill_(tok.logical_not(), -std::numeric_limits<float>::infinity());
}

at::Tensor teacher_forcing_visibility(int64_t N) {
  WM_CHECK(N > 0, "n_chunks must be > 0, got ", N);
  at::Tensor v = at::zeros({2 * N, 2 * N}, at::TensorOptions().dtype(at::kBool));
  at::Tensor tri = at::ones({N, N}, at::TensorOptions().dtype(at::kBool)).tril();
  v.narrow(0, 0, N).narrow(1, 0, N).copy_(tri);                   // clean i sees clean j <= i
  v.narrow(0, N, N).narrow(1, 0, N).copy_(tri.tril(-1));           // noisy i sees clean j < i
  v.narrow(0, N, N).narrow(1, N, N).copy_(at::eye(N, at::TensorOptions().dtype(at::kBool)));  // and itself
  return v;
}

}  // namespace wm::dit
