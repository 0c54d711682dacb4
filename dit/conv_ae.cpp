#include "dit/conv_ae.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::dit {

namespace {

constexpr const char* kPrefix = "codec.";

torch::nn::Conv2d conv(int in, int out, int k, int stride = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2));
}

}  // namespace

void ConvAeConfig::validate() const {
  WM_CHECK(!widths.empty() && widths.size() <= 6, "codec: widths must list 1 to 6 levels, got ", widths.size());
  for (int w : widths) WM_CHECK(w >= 1 && w <= 4096, "codec: a width must be in [1, 4096], got ", w);
  WM_CHECK(latent_channels >= 1 && latent_channels <= 1024, "codec: latent_channels must be in [1, 1024], got ",
           latent_channels);
  WM_CHECK(image_height > 0 && image_width > 0 && image_height % stride() == 0 && image_width % stride() == 0,
           "codec: the frame ", image_height, "x", image_width, " is not divisible by the stride ", stride());
}

std::string conv_ae_config_json(const ConvAeConfig& c) {
  return nlohmann::json{{"latent_channels", c.latent_channels},
                        {"widths", c.widths},
                        {"image_height", c.image_height},
                        {"image_width", c.image_width}}
      .dump();
}

ConvAeConfig conv_ae_config_from_json(const std::string& text, const std::string& where) {
  ConvAeConfig c;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    c.latent_channels = j.at("latent_channels").get<int>();
    c.widths = j.at("widths").get<std::vector<int>>();
    c.image_height = j.at("image_height").get<int>();
    c.image_width = j.at("image_width").get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(where, ": metadata 'codec_config' is not a codec config: ", e.what()));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(str_cat(where, ": ", e.what()));
  }
  return c;
}

ConvAeResBlockImpl::ConvAeResBlockImpl(int width) {
  conv1 = register_module("conv1", conv(width, width, 3));
  conv2 = register_module("conv2", conv(width, width, 3));
}

at::Tensor ConvAeResBlockImpl::forward(const at::Tensor& x) {
  return x + conv2->forward(at::silu(conv1->forward(at::silu(x))));
}

ConvAeImpl::ConvAeImpl(const ConvAeConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  const auto& w = cfg_.widths;
  const int L = static_cast<int>(w.size()) - 1;
  enc_in = register_module("enc_in", conv(3, w[0], 3));
  enc_blocks = register_module("enc_blocks", torch::nn::ModuleList());
  enc_down = register_module("enc_down", torch::nn::ModuleList());
  for (int i = 0; i < L; ++i) {
    enc_blocks->push_back(ConvAeResBlock(w[i]));
    enc_down->push_back(conv(w[i], w[i + 1], 3, 2));
  }
  enc_mid = register_module("enc_mid", ConvAeResBlock(w[L]));
  enc_out = register_module("enc_out", conv(w[L], cfg_.latent_channels, 1));
  dec_in = register_module("dec_in", conv(cfg_.latent_channels, w[L], 3));
  dec_mid = register_module("dec_mid", ConvAeResBlock(w[L]));
  dec_up = register_module("dec_up", torch::nn::ModuleList());
  dec_blocks = register_module("dec_blocks", torch::nn::ModuleList());
  for (int i = L; i >= 1; --i) {
    dec_up->push_back(conv(w[i], w[i - 1], 3));
    if (i - 1 > 0) dec_blocks->push_back(ConvAeResBlock(w[i - 1]));
  }
  dec_out = register_module("dec_out", conv(w[0], 3, 3));
  latent_mean = register_buffer("latent_mean", at::zeros({cfg_.latent_channels}));
  latent_std = register_buffer("latent_std", at::ones({cfg_.latent_channels}));
}

at::Tensor ConvAeImpl::encode_raw(const at::Tensor& x) {
  WM_CHECK(x.dim() == 4 && x.size(1) == 3 && x.size(2) == cfg_.image_height && x.size(3) == cfg_.image_width,
           "codec: frames must be [N, 3, ", cfg_.image_height, ", ", cfg_.image_width, "], got ", x.sizes());
  at::Tensor h = enc_in->forward(x);
  for (size_t i = 0; i < enc_down->size(); ++i) {
    h = enc_blocks[i]->as<ConvAeResBlock>()->forward(h);
    h = enc_down[i]->as<torch::nn::Conv2d>()->forward(h);
  }
  h = enc_mid->forward(h);
  return enc_out->forward(at::silu(h));
}

at::Tensor ConvAeImpl::decode_raw(const at::Tensor& z) {
  const int s = cfg_.stride();
  WM_CHECK(z.dim() == 4 && z.size(1) == cfg_.latent_channels && z.size(2) * s == cfg_.image_height &&
               z.size(3) * s == cfg_.image_width,
           "codec: latents must be [N, ", cfg_.latent_channels, ", ", cfg_.image_height / s, ", ",
           cfg_.image_width / s, "], got ", z.sizes());
  at::Tensor h = dec_mid->forward(dec_in->forward(z));
  size_t b = 0;
  for (size_t i = 0; i < dec_up->size(); ++i) {
    h = at::upsample_nearest2d(h, {h.size(2) * 2, h.size(3) * 2});
    h = dec_up[i]->as<torch::nn::Conv2d>()->forward(h);
    if (b < dec_blocks->size() && i + 1 < dec_up->size()) h = dec_blocks[b++]->as<ConvAeResBlock>()->forward(h);
  }
  return dec_out->forward(at::silu(h));
}

at::Tensor ConvAeImpl::standardise(const at::Tensor& z) const {
  return (z - latent_mean.view({1, -1, 1, 1})) / latent_std.view({1, -1, 1, 1});
}

at::Tensor ConvAeImpl::unstandardise(const at::Tensor& latents) const {
  return latents * latent_std.view({1, -1, 1, 1}) + latent_mean.view({1, -1, 1, 1});
}

void ConvAeImpl::init_weights(uint64_t seed) {
  at::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& p : named_parameters(true)) {
    at::Tensor t = p.value();
    const bool is_bias = t.dim() == 1;
    // fan_in of the conv the tensor belongs to: its weight's [out, in, k, k]
    int64_t fan_in = 1;
    if (!is_bias) {
      fan_in = t.numel() / t.size(0);
    } else {
      const std::string wname = p.key().substr(0, p.key().size() - 4) + "weight";
      const at::Tensor* w = named_parameters(true).find(wname);
      WM_CHECK(w != nullptr, "codec: no weight for bias ", p.key());
      fan_in = w->numel() / w->size(0);
    }
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    at::Tensor u = at::rand(t.sizes(), gen, at::TensorOptions().dtype(at::kFloat));
    t.copy_(u.mul_(2 * bound).sub_(bound));
  }
  dec_out->weight.mul_(0.1);
  dec_out->bias.zero_();
  latent_mean.zero_();
  latent_std.fill_(1.0);
}

std::vector<std::pair<std::string, at::Tensor>> conv_ae_tensors(ConvAeImpl& ae) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : ae.named_parameters(true))
    out.emplace_back(kPrefix + p.key(), p.value().detach().to(at::kCPU, at::kFloat).contiguous());
  for (const auto& b : ae.named_buffers(true))
    out.emplace_back(kPrefix + b.key(), b.value().detach().to(at::kCPU, at::kFloat).contiguous());
  return out;
}

void save_conv_ae(ConvAeImpl& ae, const std::string& path, const std::map<std::string, std::string>& extra_metadata) {
  std::map<std::string, std::string> meta = extra_metadata;
  meta["format"] = "wm_conv_ae";
  meta["codec_config"] = conv_ae_config_json(ae.config());
  save_safetensors(path, conv_ae_tensors(ae), meta);
}

bool has_conv_ae(const std::string& path) {
  SafeTensors st = SafeTensors::open(path);
  return st.metadata().count("codec_config") != 0;
}

ConvAe load_conv_ae(const std::string& path, at::Device device) {
  SafeTensors st = SafeTensors::open(path);
  auto it = st.metadata().find("codec_config");
  if (it == st.metadata().end())
    throw Error(str_cat(path, ": no 'codec_config' in the safetensors metadata: not a conv_ae codec file"));
  ConvAe ae(conv_ae_config_from_json(it->second, path));
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // destination, value: checked before the first copy
  auto take = [&](const std::string& name, at::Tensor dst) {
    const std::string key = kPrefix + name;
    if (!st.contains(key))
      throw Error(str_cat(path, ": missing tensor '", key, "' (expected shape ", dst.sizes(), ")"));
    const auto& e = st.entry(key);
    if (!at::isFloatingType(e.dtype))
      throw Error(str_cat(path, ": tensor '", key, "' is ", c10::toString(e.dtype), ", not a floating-point type"));
    if (at::IntArrayRef(e.shape) != dst.sizes())
      throw Error(str_cat(path, ": tensor '", key, "' has shape ", at::IntArrayRef(e.shape), ", the codec expects ",
                          dst.sizes()));
    at::Tensor v = st.get(key);
    if (!at::isfinite(v).all().item<bool>())
      throw Error(str_cat(path, ": tensor '", key, "' holds non-finite values (NaN or inf)"));
    copies.emplace_back(dst, v);
  };
  for (const auto& p : ae->named_parameters(true)) take(p.key(), p.value());
  for (const auto& b : ae->named_buffers(true)) take(b.key(), b.value());
  for (const auto& [dst, v] : copies)
    if (dst.is_same(ae->latent_std)) WM_CHECK(v.gt(0).all().item<bool>(), path, ": codec.latent_std must be positive");
  {
    at::NoGradGuard ng;
    for (auto& [dst, v] : copies) dst.copy_(v);
  }
  ae->to(device);
  ae->eval();
  return ae;
}

at::Tensor frames_to_unit(const at::Tensor& frames, at::Device device) {
  return frames.to(device).permute({0, 3, 1, 2}).to(at::kFloat).div_(127.5).sub_(1.0).contiguous();
}

at::Tensor unit_to_frames(const at::Tensor& x) {
  at::Tensor y = x.to(at::kFloat).add(1.0).mul_(127.5).round_().clamp_(0, 255).to(at::kByte);
  return y.permute({0, 2, 3, 1}).contiguous().to(at::kCPU);
}

ConvAeCodec::ConvAeCodec(ConvAe ae, at::Device device) : ae_(std::move(ae)), device_(device) {
  ae_->to(device_);
  ae_->eval();
  for (auto& p : ae_->parameters()) p.set_requires_grad(false);
}

std::unique_ptr<ConvAeCodec> ConvAeCodec::from_file(const std::string& path, at::Device device) {
  return std::make_unique<ConvAeCodec>(load_conv_ae(path, device), device);
}

at::Tensor ConvAeCodec::encode(const at::Tensor& frames, at::Device device) const {
  const auto& c = ae_->config();
  WM_CHECK(frames.dim() == 4 && frames.size(1) == c.image_height && frames.size(2) == c.image_width &&
               frames.size(3) == 3 && frames.scalar_type() == at::kByte,
           "frames must be [F, ", c.image_height, ", ", c.image_width, ", 3] uint8, got ", frames.sizes(), " ",
           frames.scalar_type());
  at::NoGradGuard ng;
  auto& ae = *ae_.ptr();  // modules are not const, the codec is stateless
  return ae.standardise(ae.encode_raw(frames_to_unit(frames, device_))).to(device).contiguous();
}

at::Tensor ConvAeCodec::decode(const at::Tensor& latents) {
  const auto& c = ae_->config();
  const int s = c.stride();
  WM_CHECK(latents.dim() == 4 && latents.size(1) == c.latent_channels && latents.size(2) * s == c.image_height &&
               latents.size(3) * s == c.image_width,
           "latents must be [F, ", c.latent_channels, ", ", c.image_height / s, ", ", c.image_width / s, "], got ",
           latents.sizes());
  at::NoGradGuard ng;
  return unit_to_frames(ae_->decode_raw(ae_->unstandardise(latents.to(device_, at::kFloat))));
}

}  // namespace wm::dit
