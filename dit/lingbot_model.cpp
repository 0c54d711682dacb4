#include "dit/lingbot_model.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/options/normalization.h>

#include <utility>

#include "runtime/error.h"

namespace wm::dit {
namespace nn = torch::nn;

namespace {

// forward_chunk's inputs against the config. Throws wm::Error naming the input.
void lingbot_check_chunk(const LingbotConfig& c, const at::Tensor& x, const at::Tensor& cond, const at::Tensor& cam,
                         const LingbotText& text, int64_t first_frame) {
  WM_CHECK(x.dim() == 4 && x.size(1) == c.out_dim && x.size(2) % c.patch_h == 0 && x.size(3) % c.patch_w == 0,
           "latents must be [F, ", c.out_dim, ", h, w] with h, w even, got ", x.sizes());
  const int64_t F = x.size(0), h = x.size(2), w = x.size(3);
  if (c.cond_channels() > 0) {
    WM_CHECK(cond.defined() && cond.dim() == 4 && cond.size(0) == F && cond.size(1) == c.cond_channels() &&
                 cond.size(2) == h && cond.size(3) == w,
             "the condition must be [", F, ", ", c.cond_channels(), ", ", h, ", ", w,
             "] (mask | image latent), got ", cond.defined() ? cond.sizes() : at::IntArrayRef{});
  }
  if (cam.defined()) {
    WM_CHECK(cam.dim() == 4 && cam.size(0) == F && cam.size(1) == c.camera_channels() && cam.size(2) == h &&
                 cam.size(3) == w,
             "the camera input must be [", F, ", ", c.camera_channels(), ", ", h, ", ", w, "] (folded rays), got ",
             cam.sizes());
  }
  WM_CHECK(first_frame >= 0, "first_frame must be >= 0, got ", first_frame);
  WM_CHECK(int(text.k.size()) == c.num_layers && int(text.v.size()) == c.num_layers, "the text context holds ",
           text.k.size(), " layers, the model ", c.num_layers);
}

// The context (a window, or the earlier chunks' K/V) holds every layer, of the model's heads.
void lingbot_check_context(const LingbotConfig& c, const WanKvContext& ctx) {
  if (ctx.window) {
    const KvSpec& ws = ctx.window->spec();
    WM_CHECK(ws.n_layers == c.num_layers && ws.n_kv_heads == c.num_heads && ws.head_dim == c.head_dim(),
             "window holds ", ws.n_layers, " layers x ", ws.n_kv_heads, " heads x ", ws.head_dim, ", the model ",
             c.num_layers, " x ", c.num_heads, " x ", c.head_dim());
  } else if (ctx.main) {
    WM_CHECK(int(ctx.main->size()) == c.num_layers, "context holds ", ctx.main->size(), " layers, the model ",
             c.num_layers);
  }
}

// x [1, n, D] under the camera: h = layer2(silu(layer1(c))) + c; (1 + scale(h)) * x + shift(h).
at::Tensor inject_camera(LingbotBlockImpl& b, const at::Tensor& x, const at::Tensor& c) {
  at::Tensor h = b.cam_injector_layer2->forward(at::silu(b.cam_injector_layer1->forward(c))) + c;
  return (1.0 + b.cam_scale_layer->forward(h)) * x + b.cam_shift_layer->forward(h);
}

}  // namespace

LingbotBlockImpl::LingbotBlockImpl(const LingbotConfig& c) {
  self_attn = register_module("self_attn", WanAttention(c.dim, c.eps));
  norm3 = register_module("norm3", nn::LayerNorm(nn::LayerNormOptions({int64_t(c.dim)}).eps(c.eps)));
  cross_attn = register_module("cross_attn", WanAttention(c.dim, c.eps));
  ffn = register_module("ffn", nn::Sequential(nn::Linear(c.dim, c.ffn_dim),
                                              nn::GELU(nn::GELUOptions().approximate("tanh")),
                                              nn::Linear(c.ffn_dim, c.dim)));
  modulation = register_parameter("modulation", at::zeros({1, 6, c.dim}));
  cam_injector_layer1 = register_module("cam_injector_layer1", nn::Linear(c.dim, c.dim));
  cam_injector_layer2 = register_module("cam_injector_layer2", nn::Linear(c.dim, c.dim));
  cam_scale_layer = register_module("cam_scale_layer", nn::Linear(c.dim, c.dim));
  cam_shift_layer = register_module("cam_shift_layer", nn::Linear(c.dim, c.dim));
}

LingbotDitImpl::LingbotDitImpl(LingbotConfig cfg, bool streamed) : cfg_(std::move(cfg)), streamed_(streamed) {
  cfg_.validate();
  const auto& c = cfg_;
  patch_embedding = register_module(
      "patch_embedding", nn::Conv3d(nn::Conv3dOptions(c.in_dim, c.dim, {c.patch_t, c.patch_h, c.patch_w})
                                        .stride({c.patch_t, c.patch_h, c.patch_w})));
  patch_embedding_wancamctrl =
      register_module("patch_embedding_wancamctrl", nn::Linear(c.camera_patch_inputs(), c.dim));
  c2ws_hidden_states_layer1 = register_module("c2ws_hidden_states_layer1", nn::Linear(c.dim, c.dim));
  c2ws_hidden_states_layer2 = register_module("c2ws_hidden_states_layer2", nn::Linear(c.dim, c.dim));
  text_embedding = register_module(
      "text_embedding", nn::Sequential(nn::Linear(c.text_dim, c.dim), nn::GELU(nn::GELUOptions().approximate("tanh")),
                                       nn::Linear(c.dim, c.dim)));
  time_embedding = register_module(
      "time_embedding", nn::Sequential(nn::Linear(c.freq_dim, c.dim), nn::SiLU(), nn::Linear(c.dim, c.dim)));
  time_projection = register_module("time_projection", nn::Sequential(nn::SiLU(), nn::Linear(c.dim, 6 * c.dim)));
  blocks = register_module("blocks", nn::ModuleList());
  for (int l = 0; l < (streamed ? 1 : c.num_layers); ++l) blocks->push_back(LingbotBlock(c));
  head = register_module("head", WanHead(c.dim, int64_t(c.patch_t) * c.patch_h * c.patch_w, c.out_dim));
  rope_ = RopeSpec::video3d(c.head_dim(), 10000.0);
}

void LingbotDitImpl::stream_blocks(std::shared_ptr<LingbotBlockSource> source) {
  WM_CHECK(streamed_, "stream_blocks: the model holds all its blocks (it was not made streamed)");
  WM_CHECK(source != nullptr, "stream_blocks: no source");
  source_ = std::move(source);
  slot_layer_ = -1;
}

LingbotBlockImpl& LingbotDitImpl::block(int l) {
  if (!streamed_) return *blocks->ptr(l)->as<LingbotBlockImpl>();
  WM_CHECK(source_ != nullptr, "a streamed LingBot model needs its block source (stream_blocks) before it runs");
  auto& slot = *blocks->ptr(0)->as<LingbotBlockImpl>();
  if (slot_layer_ != l) {
    slot_layer_ = -1;  // a load that throws leaves the slot holding no block
    source_->load(l, slot);
    slot_layer_ = l;
  }
  return slot;
}

KvSpec LingbotDitImpl::kv_spec(at::Device device, at::ScalarType dtype) const {
  return wan_kv_spec(cfg_, rope_, device, dtype);
}

LingbotText LingbotDitImpl::encode_text(const at::Tensor& context) {
  at::Tensor ctx = context.dim() == 2 ? context.unsqueeze(0) : context;
  WM_CHECK(ctx.dim() == 3 && ctx.size(0) == 1 && ctx.size(2) == cfg_.text_dim && ctx.size(1) <= cfg_.text_len,
           "the text context must be [L, ", cfg_.text_dim, "] or [1, L, ", cfg_.text_dim, "] with L <= ",
           cfg_.text_len, ", got ", context.sizes());
  const auto dt = dtype();
  at::Tensor x = ctx.to(device(), dt);
  if (x.size(1) < cfg_.text_len) x = at::cat({x, x.new_zeros({1, cfg_.text_len - x.size(1), x.size(2)})}, 1);
  x = text_embedding->forward(x);
  return wan_context_kv([this](int l) -> LingbotBlockImpl& { return block(l); }, cfg_.num_layers, x, cfg_.num_heads);
}

at::Tensor LingbotDitImpl::embed_camera(const at::Tensor& cam) {
  const auto& c = cfg_;
  const int64_t F = cam.size(0), C = cam.size(1), gh = cam.size(2) / c.patch_h, gw = cam.size(3) / c.patch_w;
  at::Tensor p = cam.to(device(), dtype())
                     .reshape({F, C, gh, c.patch_h, gw, c.patch_w})
                     .permute({0, 2, 4, 1, 3, 5})
                     .reshape({1, F * gh * gw, C * c.patch_h * c.patch_w});
  at::Tensor e = patch_embedding_wancamctrl->forward(p);
  return e + c2ws_hidden_states_layer2->forward(at::silu(c2ws_hidden_states_layer1->forward(e)));
}

at::Tensor LingbotDitImpl::forward_chunk(const at::Tensor& x_in, const at::Tensor& t_in, const at::Tensor& cond,
                                         const at::Tensor& cam, const LingbotText& text, int64_t first_frame,
                                         const WanKvContext& ctx, LingbotChunkKv* kv_out) {
  const auto& c = cfg_;
  lingbot_check_chunk(c, x_in, cond, cam, text, first_frame);
  lingbot_check_context(c, ctx);
  const auto dt = dtype();
  const auto dev = device();
  const int64_t F = x_in.size(0), D = c.dim, gh = x_in.size(2) / c.patch_h, gw = x_in.size(3) / c.patch_w;
  const WanTokens tok = wan_tokens(c, F, gh, gw, wan_positions(first_frame, F, gh, gw), rope_);
  at::Tensor t = t_in.to(dev).reshape({-1});
  WM_CHECK(t.numel() == 1 || t.numel() == F || t.numel() == tok.n, "timesteps must be a scalar, [", F, "] or [",
           tok.n, "], got ", t_in.sizes());

  at::Tensor xin = x_in.to(dev, dt);
  if (c.cond_channels() > 0) xin = at::cat({xin, cond.to(dev, dt)}, 1);
  at::Tensor h = wan_patch_embed(*patch_embedding, xin, c.patch_h, c.patch_w);  // [1, n, D]
  at::Tensor e = time_embedding->forward(wan_sinusoid(t, c.freq_dim).to(dt));   // [G, D]
  at::Tensor e0 = time_projection->forward(e).view({-1, 6, D});                  // [G, 6, D]
  const at::Tensor camera = cam.defined() ? embed_camera(cam) : at::Tensor();

  if (kv_out) kv_out->main.assign(c.num_layers, LayerKv{});
  for (int l = 0; l < c.num_layers; ++l) {
    auto& blk = block(l);
    const at::Tensor m = blk.modulation.to(dt) + e0;
    at::Tensor a = wan_self_attention(*blk.self_attn, wan_modulate(h, wan_mod(m, 0), wan_mod(m, 1), c.eps), tok, l,
                                      ctx, kv_out ? &kv_out->main[l] : nullptr);
    h = wan_gated_add(h, a, wan_mod(m, 2));
    if (camera.defined()) h = inject_camera(blk, h, camera);
    h = h + wan_cross_attention(*blk.cross_attn, wan_affine_layer_norm(*blk.norm3, h), text.k[l], text.v[l], tok);
    h = wan_gated_add(h, blk.ffn->forward(wan_modulate(h, wan_mod(m, 3), wan_mod(m, 4), c.eps)), wan_mod(m, 5));
  }
  return wan_head(*head, h, e, tok, gh, gw, c.patch_h, c.patch_w, c.out_dim).to(x_in.scalar_type());
}

}  // namespace wm::dit
