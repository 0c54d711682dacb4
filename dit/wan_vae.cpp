#include "dit/wan_vae.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "runtime/pth.h"

namespace wm::dit {

namespace {

// libtorch's CPU build has no float16 kernels for convolutions, matmuls and most element-wise
// ops: a float16 tensor on the CPU is computed in float32 and the result rounded back to float16
// after every op (see wan_vae.h).
bool emulated(const at::Tensor& t) { return t.scalar_type() == at::kHalf && t.device().is_cpu(); }
at::Tensor calc(const at::Tensor& t) { return emulated(t) ? t.to(at::kFloat) : t; }
at::Tensor in_dtype(const at::Tensor& r, at::ScalarType dt) { return r.scalar_type() == dt ? r : r.to(dt); }

at::Tensor vae_silu(const at::Tensor& x) { return in_dtype(at::silu(calc(x)), x.scalar_type()); }
at::Tensor vae_add(const at::Tensor& a, const at::Tensor& b) { return in_dtype(calc(a) + calc(b), a.scalar_type()); }

std::string shape_str(at::IntArrayRef s) { return str_cat(s); }

// Upstream's caching of a kernel-3 causal conv: the conv sees the slot's frames in front of x, and
// the slot becomes x's last two frames (the slot's last frame and x when x has one).
at::Tensor cached_conv(CausalConv3dImpl& conv, const at::Tensor& x, VaeFeatCache* cache) {
  if (!cache) return conv.forward(x);
  VaeCacheSlot& slot = cache->next();
  const int64_t T = x.size(2);
  at::Tensor keep = x.narrow(2, std::max<int64_t>(T - 2, 0), std::min<int64_t>(T, 2)).clone();
  if (keep.size(2) < 2 && slot.x.defined())
    keep = at::cat({slot.x.narrow(2, slot.x.size(2) - 1, 1), keep}, 2);
  at::Tensor y = conv.forward(x, slot.x);
  slot.x = keep;
  slot.rep = false;
  return y;
}

// [B, C, T, H, W] <-> [B*T, C, H, W] (einops 'b c t h w -> (b t) c h w' and back).
at::Tensor frames_of(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3, 4}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
at::Tensor video_of(const at::Tensor& f, int64_t T) {
  return f.reshape({f.size(0) / T, T, f.size(1), f.size(2), f.size(3)}).permute({0, 2, 1, 3, 4});
}

std::shared_ptr<torch::nn::Module> no_params() { return torch::nn::Identity().ptr(); }

}  // namespace

// ---- config, constants ----

void WanVaeConfig::validate() const {
  WM_CHECK(dim > 0 && z_dim > 0 && num_res_blocks > 0, "dim ", dim, ", z_dim ", z_dim, " and num_res_blocks ",
           num_res_blocks, " must be positive");
  WM_CHECK(dim_mult.size() >= 2, "dim_mult needs at least 2 entries, got ", dim_mult.size());
  for (int64_t m : dim_mult) WM_CHECK(m > 0, "dim_mult entries must be positive, got ", m);
  WM_CHECK(temporal_downsample.size() + 1 == dim_mult.size(), "temporal_downsample needs ", dim_mult.size() - 1,
           " entries (one per down-sampling), got ", temporal_downsample.size());
}

WanVaeConfig WanVaeConfig::from_state_dict(const std::map<std::string, at::Tensor>& sd, const std::string& where) {
  WanVaeConfig c;
  auto dim_of = [&](const char* key, int64_t axis) -> int64_t {
    auto it = sd.find(key);
    if (it == sd.end()) return -1;
    WM_CHECK(it->second.dim() == 5, where, ": '", key, "' must be 5-d, got ", it->second.sizes());
    return it->second.size(axis);
  };
  int64_t d = dim_of("encoder.conv1.weight", 0);
  if (d < 0) d = dim_of("decoder.head.2.weight", 1);
  if (d < 0) throw Error(str_cat(where, ": neither 'encoder.conv1.weight' nor 'decoder.head.2.weight' is there: not a "
                                        "Wan VAE state dict"));
  int64_t z = dim_of("conv2.weight", 0);
  if (z < 0) {
    z = dim_of("conv1.weight", 0);
    if (z > 0) z /= 2;
  }
  if (z <= 0) throw Error(str_cat(where, ": neither 'conv2.weight' nor 'conv1.weight' is there: not a Wan VAE state dict"));
  c.dim = d;
  c.z_dim = z;
  return c;
}

at::Tensor wan_vae_mean() {
  static const float v[16] = {-0.7571f, -0.7089f, -0.9113f, 0.1075f, -0.1745f, 0.9653f, -0.1517f, 1.5508f,
                              0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f};
  return at::tensor(at::ArrayRef<float>(v, 16));
}

at::Tensor wan_vae_std() {
  static const float v[16] = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                              3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};
  return at::tensor(at::ArrayRef<float>(v, 16));
}

VaeCacheSlot& VaeFeatCache::next() {
  if (idx >= slots.size()) slots.resize(idx + 1);
  return slots[idx++];
}

// ---- building blocks ----

CausalConv3dImpl::CausalConv3dImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride_,
                                   std::vector<int64_t> padding_)
    : stride(std::move(stride_)), padding(std::move(padding_)) {
  // Uninitialised until load(): the weights of the real model are 0.5 GB.
  weight = register_parameter("weight", at::empty({out, in, kernel[0], kernel[1], kernel[2]}));
  bias = register_parameter("bias", at::zeros({out}));
}

at::Tensor CausalConv3dImpl::forward(const at::Tensor& x, const at::Tensor& cache) {
  int64_t pad_t = 2 * padding[0];
  at::Tensor in = x;
  if (cache.defined() && pad_t > 0) {
    in = at::cat({cache.to(x.device()), x}, 2);
    pad_t -= cache.size(2);
  }
  if (pad_t > 0) {
    std::vector<int64_t> zs = in.sizes().vec();
    zs[2] = pad_t;
    in = at::cat({at::zeros(zs, in.options()), in}, 2);
  } else if (pad_t < 0) {  // F.pad with a negative amount crops
    in = in.narrow(2, -pad_t, in.size(2) + pad_t);
  }
  at::Tensor y = at::conv3d(calc(in), calc(weight), calc(bias), stride, {0, padding[1], padding[2]});
  return in_dtype(y, x.scalar_type());
}

VaeConv2dImpl::VaeConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_)
    : stride(stride_), padding(padding_) {
  weight = register_parameter("weight", at::empty({out, in, kernel, kernel}));
  bias = register_parameter("bias", at::zeros({out}));
}

at::Tensor VaeConv2dImpl::forward(const at::Tensor& x) {
  return in_dtype(at::conv2d(calc(x), calc(weight), calc(bias), stride, padding), x.scalar_type());
}

VaeRmsNormImpl::VaeRmsNormImpl(int64_t dim, bool images) : scale(std::sqrt(double(dim))) {
  gamma = register_parameter("gamma", images ? at::ones({dim, 1, 1}) : at::ones({dim, 1, 1, 1}));
}

at::Tensor VaeRmsNormImpl::forward(const at::Tensor& x) {
  // F.normalize(x, dim=1) * scale * gamma, op by op in x's dtype. In float32 the channels' L2 norm
  // is sqrt(sum(x^2)): libtorch's norm() reduces over a middle dimension slowly on the CPU (one
  // norm of [1, 96, 4, 176, 320] 86 ms against 56, of a 1-wide VAE's [1, 1, 4, 352, 640] 61 ms
  // against 2.5), with the same value up to float32 rounding.
  // Other dtypes (bfloat16; float16 on a GPU) keep norm(), which sums in float32: a float16 square
  // could overflow.
  const at::ScalarType dt = x.scalar_type();
  const at::Tensor xc = calc(x);
  at::Tensor n = xc.scalar_type() == at::kFloat ? xc.square().sum(1, true).sqrt_() : xc.norm(2, {1}, true);
  n = in_dtype(n, dt);
  n = in_dtype(calc(n).clamp_min(1e-12), dt);
  at::Tensor y = in_dtype(calc(x) / calc(n), dt);
  y = in_dtype(calc(y) * scale, dt);
  return in_dtype(calc(y) * calc(gamma), dt);
}

VaeResidualBlockImpl::VaeResidualBlockImpl(int64_t in, int64_t out) {
  norm1 = VaeRmsNorm(in, false);
  conv1 = CausalConv3d(in, out, std::vector<int64_t>{3, 3, 3}, std::vector<int64_t>{1, 1, 1},
                       std::vector<int64_t>{1, 1, 1});
  norm2 = VaeRmsNorm(out, false);
  conv2 = CausalConv3d(out, out, std::vector<int64_t>{3, 3, 3}, std::vector<int64_t>{1, 1, 1},
                       std::vector<int64_t>{1, 1, 1});
  residual = torch::nn::ModuleList();
  residual->push_back(norm1);
  residual->push_back(no_params());  // SiLU
  residual->push_back(conv1);
  residual->push_back(norm2);
  residual->push_back(no_params());  // SiLU
  residual->push_back(no_params());  // Dropout (0 at inference)
  residual->push_back(conv2);
  register_module("residual", residual);
  if (in != out) shortcut = register_module("shortcut", CausalConv3d(in, out, std::vector<int64_t>{1, 1, 1}));
}

at::Tensor VaeResidualBlockImpl::forward(const at::Tensor& x, VaeFeatCache* cache) {
  at::Tensor h = shortcut ? shortcut->forward(x) : x;
  at::Tensor y = vae_silu(norm1->forward(x));
  y = cached_conv(*conv1, y, cache);
  y = vae_silu(norm2->forward(y));
  y = cached_conv(*conv2, y, cache);
  return vae_add(y, h);
}

VaeAttentionBlockImpl::VaeAttentionBlockImpl(int64_t dim) {
  norm = register_module("norm", VaeRmsNorm(dim, true));
  to_qkv = register_module("to_qkv", VaeConv2d(dim, 3 * dim, 1, 1, 0));
  proj = register_module("proj", VaeConv2d(dim, dim, 1, 1, 0));
}

at::Tensor VaeAttentionBlockImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4);
  const at::ScalarType dt = x.scalar_type();
  at::Tensor f = norm->forward(frames_of(x));                                        // [BT, C, H, W]
  at::Tensor qkv = to_qkv->forward(f).reshape({B * T, 3 * C, H * W}).transpose(1, 2);  // [BT, HW, 3C]
  // Scores, softmax and the weighted sum in float32 (upstream's SDPA kernels accumulate in
  // float32 for float16 / bfloat16), the result in the module's dtype.
  at::Tensor q = qkv.narrow(2, 0, C).to(at::kFloat), k = qkv.narrow(2, C, C).to(at::kFloat),
             v = qkv.narrow(2, 2 * C, C).to(at::kFloat);
  at::Tensor s = at::bmm(q, k.transpose(1, 2)).mul_(1.0 / std::sqrt(double(C)));
  at::Tensor o = in_dtype(at::bmm(at::softmax(s, -1), v), dt);             // [BT, HW, C]
  o = o.transpose(1, 2).reshape({B * T, C, H, W});
  return vae_add(video_of(proj->forward(o), T), x);
}

VaeResampleImpl::VaeResampleImpl(int64_t dim, ResampleMode m) : mode(m) {
  const bool upm = m == ResampleMode::Upsample2d || m == ResampleMode::Upsample3d;
  conv = upm ? VaeConv2d(dim, dim / 2, 3, 1, 1) : VaeConv2d(dim, dim, 3, 2, 0);
  resample = torch::nn::ModuleList();
  resample->push_back(no_params());  // nearest x2 up-sampling, or ZeroPad2d(0, 1, 0, 1)
  resample->push_back(conv);
  register_module("resample", resample);
  if (m == ResampleMode::Upsample3d)
    time_conv = register_module("time_conv", CausalConv3d(dim, 2 * dim, std::vector<int64_t>{3, 1, 1},
                                                          std::vector<int64_t>{1, 1, 1},
                                                          std::vector<int64_t>{1, 0, 0}));
  else if (m == ResampleMode::Downsample3d)
    time_conv = register_module("time_conv", CausalConv3d(dim, dim, std::vector<int64_t>{3, 1, 1},
                                                          std::vector<int64_t>{2, 1, 1},
                                                          std::vector<int64_t>{0, 0, 0}));
}

at::Tensor VaeResampleImpl::forward(const at::Tensor& x_in, VaeFeatCache* cache) {
  at::Tensor x = x_in;
  const at::ScalarType dt = x.scalar_type();
  if (mode == ResampleMode::Upsample3d && cache) {
    VaeCacheSlot& slot = cache->next();
    if (slot.empty()) {
      slot.rep = true;  // first latent of the stream: no temporal doubling
    } else {
      const int64_t B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4);
      at::Tensor keep = x.narrow(2, std::max<int64_t>(T - 2, 0), std::min<int64_t>(T, 2)).clone();
      if (keep.size(2) < 2) {
        keep = slot.rep ? at::cat({at::zeros_like(keep), keep}, 2)
                        : at::cat({slot.x.narrow(2, slot.x.size(2) - 1, 1), keep}, 2);
      }
      at::Tensor y = slot.rep ? time_conv->forward(x) : time_conv->forward(x, slot.x);
      slot.x = keep;
      slot.rep = false;
      // [B, 2C, T] -> channel halves as frames 2t and 2t+1
      x = y.reshape({B, 2, C, T, H, W}).permute({0, 2, 3, 1, 4, 5}).reshape({B, C, 2 * T, H, W});
    }
  }
  const int64_t T = x.size(2);
  at::Tensor f = frames_of(x);
  if (mode == ResampleMode::Upsample2d || mode == ResampleMode::Upsample3d) {
    f = at::upsample_nearest2d(f.to(at::kFloat), {2 * f.size(2), 2 * f.size(3)}).to(dt);  // in float32, as upstream
  } else {
    f = at::constant_pad_nd(f, {0, 1, 0, 1});
  }
  x = video_of(conv->forward(f), T);
  if (mode == ResampleMode::Downsample3d && cache) {
    VaeCacheSlot& slot = cache->next();
    if (slot.empty()) {
      slot.x = x.clone();  // first frame: kept, no temporal down-sampling
    } else {
      at::Tensor keep = x.narrow(2, x.size(2) - 1, 1).clone();
      x = time_conv->forward(at::cat({slot.x.narrow(2, slot.x.size(2) - 1, 1), x}, 2));
      slot.x = keep;
    }
  }
  return x;
}

// ---- encoder, decoder ----

VaeEncoder3dImpl::VaeEncoder3dImpl(const WanVaeConfig& c) {
  std::vector<int64_t> dims{c.dim};
  for (int64_t m : c.dim_mult) dims.push_back(c.dim * m);
  conv1 = register_module("conv1", CausalConv3d(3, dims[0], std::vector<int64_t>{3, 3, 3},
                                                std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
  downsamples = torch::nn::ModuleList();
  int64_t out_dim = dims[0];
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    int64_t in_dim = dims[i];
    out_dim = dims[i + 1];
    for (int64_t r = 0; r < c.num_res_blocks; ++r) {
      VaeResidualBlock b(in_dim, out_dim);
      downsamples->push_back(b);
      down_res.push_back(b);
      down_resample.push_back(nullptr);
      in_dim = out_dim;
    }
    if (i + 1 != c.dim_mult.size()) {
      VaeResample s(out_dim, c.temporal_downsample[i] ? ResampleMode::Downsample3d : ResampleMode::Downsample2d);
      downsamples->push_back(s);
      down_res.push_back(nullptr);
      down_resample.push_back(s);
    }
  }
  register_module("downsamples", downsamples);
  mid0 = VaeResidualBlock(out_dim, out_dim);
  mid1 = VaeAttentionBlock(out_dim);
  mid2 = VaeResidualBlock(out_dim, out_dim);
  middle = torch::nn::ModuleList();
  middle->push_back(mid0);
  middle->push_back(mid1);
  middle->push_back(mid2);
  register_module("middle", middle);
  head_norm = VaeRmsNorm(out_dim, false);
  head_conv = CausalConv3d(out_dim, 2 * c.z_dim, std::vector<int64_t>{3, 3, 3}, std::vector<int64_t>{1, 1, 1},
                           std::vector<int64_t>{1, 1, 1});
  head = torch::nn::ModuleList();
  head->push_back(head_norm);
  head->push_back(no_params());  // SiLU
  head->push_back(head_conv);
  register_module("head", head);
}

at::Tensor VaeEncoder3dImpl::forward(const at::Tensor& x_in, VaeFeatCache* cache) {
  at::Tensor x = cached_conv(*conv1, x_in, cache);
  for (size_t i = 0; i < down_res.size(); ++i)
    x = down_res[i] ? down_res[i]->forward(x, cache) : down_resample[i]->forward(x, cache);
  x = mid0->forward(x, cache);
  x = mid1->forward(x);
  x = mid2->forward(x, cache);
  return cached_conv(*head_conv, vae_silu(head_norm->forward(x)), cache);
}

VaeDecoder3dImpl::VaeDecoder3dImpl(const WanVaeConfig& c) {
  std::vector<int64_t> dims{c.dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(c.dim * *it);
  const size_t n_up = c.temporal_downsample.size();
  conv1 = register_module("conv1", CausalConv3d(c.z_dim, dims[0], std::vector<int64_t>{3, 3, 3},
                                                std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
  mid0 = VaeResidualBlock(dims[0], dims[0]);
  mid1 = VaeAttentionBlock(dims[0]);
  mid2 = VaeResidualBlock(dims[0], dims[0]);
  middle = torch::nn::ModuleList();
  middle->push_back(mid0);
  middle->push_back(mid1);
  middle->push_back(mid2);
  register_module("middle", middle);
  upsamples = torch::nn::ModuleList();
  int64_t out_dim = dims[0];
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    int64_t in_dim = dims[i];
    out_dim = dims[i + 1];
    if (i >= 1) in_dim /= 2;  // the previous up-sampling halved the channels
    for (int64_t r = 0; r < c.num_res_blocks + 1; ++r) {
      VaeResidualBlock b(in_dim, out_dim);
      upsamples->push_back(b);
      up_res.push_back(b);
      up_resample.push_back(nullptr);
      in_dim = out_dim;
    }
    if (i + 1 != c.dim_mult.size()) {
      const bool t_up = c.temporal_downsample[n_up - 1 - i];  // temporal_upsample = reversed
      VaeResample s(out_dim, t_up ? ResampleMode::Upsample3d : ResampleMode::Upsample2d);
      upsamples->push_back(s);
      up_res.push_back(nullptr);
      up_resample.push_back(s);
    }
  }
  register_module("upsamples", upsamples);
  head_norm = VaeRmsNorm(out_dim, false);
  head_conv = CausalConv3d(out_dim, 3, std::vector<int64_t>{3, 3, 3}, std::vector<int64_t>{1, 1, 1},
                           std::vector<int64_t>{1, 1, 1});
  head = torch::nn::ModuleList();
  head->push_back(head_norm);
  head->push_back(no_params());  // SiLU
  head->push_back(head_conv);
  register_module("head", head);
}

at::Tensor VaeDecoder3dImpl::forward(const at::Tensor& x_in, VaeFeatCache* cache) {
  at::Tensor x = cached_conv(*conv1, x_in, cache);
  x = mid0->forward(x, cache);
  x = mid1->forward(x);
  x = mid2->forward(x, cache);
  for (size_t i = 0; i < up_res.size(); ++i)
    x = up_res[i] ? up_res[i]->forward(x, cache) : up_resample[i]->forward(x, cache);
  return cached_conv(*head_conv, vae_silu(head_norm->forward(x)), cache);
}

// ---- the VAE ----

void WanVaeDecodeState::reset() {
  cache_ = VaeFeatCache();
  latents_ = 0;
}

int64_t WanVaeDecodeState::frames_for(int64_t n) const {
  if (n <= 0) return 0;
  return latents_ == 0 ? 1 + 4 * (n - 1) : 4 * n;
}

WanVaeImpl::WanVaeImpl(const WanVaeConfig& cfg, WanVaeParts parts) : cfg_(cfg), parts_(parts) {
  cfg_.validate();
  if (parts != WanVaeParts::Decoder) {
    encoder = register_module("encoder", VaeEncoder3d(cfg_));
    conv1 = register_module("conv1", CausalConv3d(2 * cfg_.z_dim, 2 * cfg_.z_dim, std::vector<int64_t>{1, 1, 1}));
  }
  if (parts != WanVaeParts::Encoder) {
    conv2 = register_module("conv2", CausalConv3d(cfg_.z_dim, cfg_.z_dim, std::vector<int64_t>{1, 1, 1}));
    decoder = register_module("decoder", VaeDecoder3d(cfg_));
  }
}

at::ScalarType WanVaeImpl::dtype() const {
  return (conv2 ? conv2->weight : conv1->weight).scalar_type();
}

at::Device WanVaeImpl::device() const { return (conv2 ? conv2->weight : conv1->weight).device(); }

at::Tensor WanVaeImpl::encode(const at::Tensor& video) {
  WM_CHECK(encoder, "this Wan VAE was built without its encoder");
  const int64_t factor = int64_t(1) << (cfg_.dim_mult.size() - 1);
  WM_CHECK(video.dim() == 5 && video.size(1) == 3 && video.size(2) >= 1 && (video.size(2) - 1) % 4 == 0 &&
               video.size(3) % factor == 0 && video.size(4) % factor == 0 && video.is_floating_point(),
           "video must be [B, 3, 1 + 4k, H, W] float with H and W multiples of ", factor, ", got ", video.sizes(), " ",
           video.scalar_type());
  at::NoGradGuard ng;
  const at::ScalarType dt = dtype();
  at::Tensor x = video.to(device(), dt);
  VaeFeatCache cache;
  const int64_t T = x.size(2), iters = 1 + (T - 1) / 4;
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < iters; ++i) {
    cache.idx = 0;
    at::Tensor part = i == 0 ? x.narrow(2, 0, 1) : x.narrow(2, 1 + 4 * (i - 1), 4);
    outs.push_back(encoder->forward(part, &cache));
  }
  at::Tensor mu = conv1->forward(at::cat(outs, 2)).narrow(1, 0, cfg_.z_dim);
  // scale = [mean, 1 / std] in float32, cast to mu's dtype: (mu - mean) * (1 / std)
  WM_CHECK(cfg_.z_dim == 16, "the latent normalisation is Wan2.1's, for 16 channels; z_dim is ", cfg_.z_dim);
  at::Tensor mean = wan_vae_mean().to(x.device(), dt).view({1, -1, 1, 1, 1});
  at::Tensor inv = at::reciprocal(wan_vae_std()).to(x.device(), dt).view({1, -1, 1, 1, 1});
  mu = in_dtype(calc(mu) - calc(mean), dt);
  return in_dtype(calc(mu) * calc(inv), dt);
}

at::Tensor WanVaeImpl::decode_chunk(const at::Tensor& latents, WanVaeDecodeState& state) {
  WM_CHECK(decoder, "this Wan VAE was built without its decoder");
  WM_CHECK(latents.dim() == 5 && latents.size(1) >= 1 && latents.size(2) == cfg_.z_dim && latents.is_floating_point(),
           "latents must be [B, F, ", cfg_.z_dim, ", h, w] float, got ", latents.sizes(), " ", latents.scalar_type());
  WM_CHECK(cfg_.z_dim == 16, "the latent normalisation is Wan2.1's, for 16 channels; z_dim is ", cfg_.z_dim);
  if (!state.cache_.slots.empty()) {  // same spatial size as the stream so far
    const at::Tensor& s0 = state.cache_.slots[0].x;
    WM_CHECK(!s0.defined() || (s0.size(0) == latents.size(0) && s0.size(3) == latents.size(3) &&
                               s0.size(4) == latents.size(4)),
             "latents ", latents.sizes(), " do not continue the stream of [", s0.size(0), ", F, ", cfg_.z_dim, ", ",
             s0.size(3), ", ", s0.size(4), "] (reset the state for a new size)");
  }
  at::NoGradGuard ng;
  const at::ScalarType dt = dtype();
  at::Tensor z = latents.to(device(), dt).permute({0, 2, 1, 3, 4});  // [B, 16, F, h, w]
  // scale = [mean, 1 / std] cast to z's dtype first (the reciprocal in that dtype): z / (1 / std) + mean
  at::Tensor stdv = wan_vae_std().to(z.device(), dt);
  at::Tensor inv = in_dtype(at::reciprocal(calc(stdv)), dt).view({1, -1, 1, 1, 1});
  at::Tensor mean = wan_vae_mean().to(z.device(), dt).view({1, -1, 1, 1, 1});
  z = in_dtype(calc(z) / calc(inv), dt);
  z = in_dtype(calc(z) + calc(mean), dt);
  at::Tensor x = conv2->forward(z);
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < x.size(2); ++i) {
    state.cache_.idx = 0;
    outs.push_back(decoder->forward(x.narrow(2, i, 1), &state.cache_));
    ++state.latents_;
  }
  at::Tensor out = at::cat(outs, 2).to(at::kFloat).clamp_(-1, 1);
  return out.permute({0, 2, 1, 3, 4}).contiguous();  // [B, F', 3, H, W]
}

std::map<std::string, std::vector<int64_t>> WanVaeImpl::expected_keys() const {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : named_parameters(true)) out[p.key()] = p.value().sizes().vec();
  return out;
}

void WanVaeImpl::load(const std::map<std::string, at::Tensor>& sd, const std::string& where) {
  auto params = named_parameters(true);
  for (const auto& p : params) {
    auto it = sd.find(p.key());
    if (it == sd.end())
      throw Error(str_cat("Wan VAE: ", where, ": missing key '", p.key(), "' (shape ", shape_str(p.value().sizes()),
                          ")"));
    if (it->second.sizes() != p.value().sizes())
      throw Error(str_cat("Wan VAE: ", where, ": key '", p.key(), "' has shape ", shape_str(it->second.sizes()),
                          ", expected ", shape_str(p.value().sizes())));
    if (!it->second.is_floating_point())
      throw Error(str_cat("Wan VAE: ", where, ": key '", p.key(), "' is ", it->second.scalar_type(),
                          ", expected a floating dtype"));
  }
  for (const auto& kv : sd)
    if (!params.contains(kv.first))
      throw Error(str_cat("Wan VAE: ", where, ": unexpected key '", kv.first, "'"));
  at::NoGradGuard ng;
  for (auto& p : params) p.value().copy_(sd.at(p.key()));
}

std::map<std::string, at::Tensor> wan_vae_select(const std::map<std::string, at::Tensor>& sd, WanVaeParts parts) {
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : sd) {
    const std::string& k = kv.first;
    bool take = true;
    if (parts == WanVaeParts::Decoder)
      take = k.find("decoder.") != std::string::npos || k.find("conv2") != std::string::npos;
    else if (parts == WanVaeParts::Encoder)
      take = k.rfind("encoder.", 0) == 0 || k.rfind("conv1.", 0) == 0;
    if (take) out.emplace(k, kv.second);
  }
  return out;
}

WanVae make_wan_vae(const std::map<std::string, at::Tensor>& sd, WanVaeParts parts, at::ScalarType dtype,
                    at::Device device, const std::string& where) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
           "the Wan VAE runs in float32, float16 or bfloat16, not ", dtype);
  WanVae m(WanVaeConfig::from_state_dict(sd, where), parts);
  m->to(device, dtype);
  m->load(wan_vae_select(sd, parts), where);
  m->eval();
  return m;
}

WanVae load_wan_vae(const std::string& path, WanVaeParts parts, at::ScalarType dtype, at::Device device) {
  return make_wan_vae(load_state_dict(path), parts, dtype, device, path);
}

at::Tensor wan_vae_to_uint8(const at::Tensor& frames) {
  return frames.to(at::kFloat).add(1.0).mul_(127.5).clamp_(0, 255).to(at::kByte);
}

}  // namespace wm::dit
