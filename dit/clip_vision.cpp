#include "dit/clip_vision.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <functional>

#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"

namespace wm::dit {

namespace {

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string where(const std::string& source) { return source.empty() ? "" : " in " + source; }

at::ScalarType default_dtype(at::ScalarType stored) {
  return stored == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

// Reads the tower's tensors through `get(name) -> tensor or undefined`, checking names and shapes.
std::vector<at::Tensor> gather(const ClipVisionConfig& cfg, const std::string& prefix,
                               const std::string& source,
                               const std::function<at::Tensor(const std::string&)>& get) {
  std::vector<at::Tensor> out;
  for (const auto& [name, shape] : ClipVision::expected_keys(cfg, prefix)) {
    at::Tensor t = get(name);
    WM_CHECK(t.defined(), "CLIP vision weight '", name, "' missing", where(source));
    WM_CHECK(t.sizes() == at::IntArrayRef(shape), "CLIP vision weight '", name, "'", where(source),
             " has shape ", shape_str(t.sizes()), ", expected ", shape_str(shape));
    WM_CHECK(at::isFloatingType(t.scalar_type()), "CLIP vision weight '", name, "'", where(source),
             " has non-floating dtype ", t.scalar_type());
    out.push_back(t);
  }
  return out;
}

}  // namespace

void ClipVisionConfig::validate() const {
  WM_CHECK(image_size > 0 && patch_size > 0 && dim > 0 && heads > 0 && mlp_dim > 0,
           "CLIP vision config sizes must be positive (image ", image_size, ", patch ", patch_size,
           ", dim ", dim, ", heads ", heads, ", mlp ", mlp_dim, ")");
  WM_CHECK(image_size % patch_size == 0, "CLIP vision image size ", image_size,
           " is not a multiple of the patch size ", patch_size);
  WM_CHECK(dim % heads == 0, "CLIP vision dim ", dim, " is not a multiple of heads ", heads);
  WM_CHECK(layers >= 2, "CLIP vision needs at least 2 layers (the last is skipped), got ", layers);
  WM_CHECK(norm_eps > 0, "CLIP vision norm_eps must be positive, got ", norm_eps);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ClipVision::expected_keys(
    const ClipVisionConfig& cfg, const std::string& prefix) {
  const int64_t d = cfg.dim, p = cfg.patch_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> keys = {
      {prefix + "patch_embedding.weight", {d, 3, p, p}},
      {prefix + "cls_embedding", {1, 1, d}},
      {prefix + "pos_embedding", {1, cfg.tokens(), d}},
      {prefix + "pre_norm.weight", {d}},
      {prefix + "pre_norm.bias", {d}},
  };
  for (int64_t i = 0; i < cfg.blocks_run(); ++i) {
    const std::string b = prefix + "transformer." + std::to_string(i) + ".";
    keys.push_back({b + "norm1.weight", {d}});
    keys.push_back({b + "norm1.bias", {d}});
    keys.push_back({b + "attn.to_qkv.weight", {3 * d, d}});
    keys.push_back({b + "attn.to_qkv.bias", {3 * d}});
    keys.push_back({b + "attn.proj.weight", {d, d}});
    keys.push_back({b + "attn.proj.bias", {d}});
    keys.push_back({b + "norm2.weight", {d}});
    keys.push_back({b + "norm2.bias", {d}});
    keys.push_back({b + "mlp.0.weight", {cfg.mlp_dim, d}});
    keys.push_back({b + "mlp.0.bias", {cfg.mlp_dim}});
    keys.push_back({b + "mlp.2.weight", {d, cfg.mlp_dim}});
    keys.push_back({b + "mlp.2.bias", {d}});
  }
  return keys;
}

void ClipVision::assign(const std::vector<at::Tensor>& t) {
  const auto opts = at::TensorOptions().device(device_).dtype(dtype_);
  // Norm weights are rounded to the tower's dtype first (upstream casts the whole model), then
  // kept in float32 where the norms compute.
  auto model = [&](const at::Tensor& x) { return x.to(opts).contiguous(); };
  auto norm = [&](const at::Tensor& x) { return x.to(opts).to(at::kFloat).contiguous(); };
  size_t i = 0;
  patch_w_ = model(t[i++].reshape({cfg_.dim, -1}));
  cls_ = model(t[i++]);
  pos_ = model(t[i++]);
  pre_w_ = norm(t[i++]);
  pre_b_ = norm(t[i++]);
  blocks_.clear();
  for (int64_t l = 0; l < cfg_.blocks_run(); ++l) {
    Block b;
    b.norm1_w = norm(t[i++]);
    b.norm1_b = norm(t[i++]);
    b.qkv_w = model(t[i++]);
    b.qkv_b = model(t[i++]);
    b.proj_w = model(t[i++]);
    b.proj_b = model(t[i++]);
    b.norm2_w = norm(t[i++]);
    b.norm2_b = norm(t[i++]);
    b.fc1_w = model(t[i++]);
    b.fc1_b = model(t[i++]);
    b.fc2_w = model(t[i++]);
    b.fc2_b = model(t[i++]);
    blocks_.push_back(std::move(b));
  }
}

ClipVision ClipVision::from_state_dict(const std::map<std::string, at::Tensor>& state_dict,
                                       const ClipVisionConfig& cfg, const ClipVisionOptions& opt,
                                       const std::string& source) {
  cfg.validate();
  auto tensors = gather(cfg, opt.prefix, source, [&](const std::string& name) {
    auto it = state_dict.find(name);
    return it == state_dict.end() ? at::Tensor() : it->second;
  });
  const at::ScalarType dtype = opt.dtype.value_or(default_dtype(tensors[0].scalar_type()));
  WM_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
           "CLIP vision runs in float32 or bfloat16, got ", dtype);
  ClipVision m(cfg, dtype, opt.device);
  m.assign(tensors);
  return m;
}

ClipVision ClipVision::load(const std::string& path, const ClipVisionConfig& cfg,
                            const ClipVisionOptions& opt) {
  cfg.validate();
  std::vector<at::Tensor> tensors;
  switch (sniff_checkpoint_format(path)) {
    case CheckpointFormat::Safetensors: {
      const SafeTensors st = SafeTensors::open(path);
      tensors = gather(cfg, opt.prefix, path, [&](const std::string& name) {
        return st.contains(name) ? st.get(name) : at::Tensor();
      });
      break;
    }
    case CheckpointFormat::PthZip: {
      // Only the tower's storages are read: the whole CLIP file is mostly the text tower.
      const PthFile pth = PthFile::open(path);
      std::map<std::string, size_t> index;
      for (size_t i = 0; i < pth.tensors().size(); ++i) index.emplace(pth.tensors()[i].name, i);
      tensors = gather(cfg, opt.prefix, path, [&](const std::string& name) {
        auto it = index.find(name);
        return it == index.end() ? at::Tensor() : pth.get(it->second);
      });
      break;
    }
    default:
      throw CorruptData(str_cat("ClipVision::load: ", path,
                                " is neither a safetensors file nor a torch.save zip checkpoint"));
  }
  const at::ScalarType dtype = opt.dtype.value_or(default_dtype(tensors[0].scalar_type()));
  WM_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
           "CLIP vision runs in float32 or bfloat16, got ", dtype);
  ClipVision m(cfg, dtype, opt.device);
  m.assign(tensors);
  return m;
}

ClipVision ClipVision::random(const ClipVisionConfig& cfg, uint64_t seed,
                              const ClipVisionOptions& opt) {
  cfg.validate();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> tensors;
  for (const auto& [name, shape] : expected_keys(cfg, "")) {
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() > 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    at::Tensor t = at::randn(shape, gen, at::kFloat);
    if (is_norm && !is_bias) {
      t = 1.0 + 0.1 * t;
    } else if (is_bias) {
      t = 0.05 * t;
    } else if (name == "cls_embedding" || name == "pos_embedding") {
      t = 0.5 * t;
    } else {
      t = t / std::sqrt(static_cast<double>(t[0].numel()));
    }
    tensors.push_back(t);
  }
  ClipVision m(cfg, opt.dtype.value_or(at::kFloat), opt.device);
  WM_CHECK(m.dtype_ == at::kFloat || m.dtype_ == at::kBFloat16,
           "CLIP vision runs in float32 or bfloat16, got ", m.dtype_);
  m.assign(tensors);
  return m;
}

at::Tensor ClipVision::layer_norm(const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& b) const {
  return at::layer_norm(x.to(at::kFloat), {cfg_.dim}, w, b, cfg_.norm_eps).to(dtype_);
}

at::Tensor ClipVision::attention(const at::Tensor& x, const Block& blk) const {
  const int64_t B = x.size(0), L = x.size(1), H = cfg_.heads, D = cfg_.head_dim();
  // to_qkv's output channels are (3, heads, head_dim): q, k, v, each head's channels together.
  const at::Tensor qkv = at::linear(x, blk.qkv_w, blk.qkv_b).view({B, L, 3, H, D});
  const at::Tensor q = qkv.select(2, 0).permute({0, 2, 1, 3}).to(at::kFloat);  // [B, H, L, D]
  const at::Tensor k = qkv.select(2, 1).permute({0, 2, 1, 3}).to(at::kFloat);
  const at::Tensor v = qkv.select(2, 2).permute({0, 2, 1, 3}).to(at::kFloat);
  const at::Tensor scores = at::matmul(q, k.transpose(-1, -2)).mul_(1.0 / std::sqrt(double(D)));
  const at::Tensor o = at::matmul(at::softmax(scores, -1), v);                 // [B, H, L, D]
  return at::linear(o.permute({0, 2, 1, 3}).reshape({B, L, H * D}).to(dtype_), blk.proj_w,
                    blk.proj_b);
}

at::Tensor ClipVision::forward(const at::Tensor& pixels) const {
  const int64_t S = cfg_.image_size, P = cfg_.patch_size, G = cfg_.grid();
  WM_CHECK(pixels.dim() == 4 && pixels.size(1) == 3 && pixels.size(2) == S && pixels.size(3) == S,
           "CLIP vision input must be [B, 3, ", S, ", ", S, "], got ", shape_str(pixels.sizes()));
  WM_CHECK(at::isFloatingType(pixels.scalar_type()), "CLIP vision input must be floating, got ",
           pixels.scalar_type());
  WM_CHECK(pixels.device() == device_, "CLIP vision input on ", pixels.device(),
           ", the tower is on ", device_);
  const int64_t B = pixels.size(0);
  // The stride-P, kernel-P convolution is a matmul over non-overlapping patches, flattened
  // (c, ky, kx) as the conv weight is; tokens follow the grid row-major (flatten(2)).
  const at::Tensor patches = pixels.to(dtype_)
                                 .reshape({B, 3, G, P, G, P})
                                 .permute({0, 2, 4, 1, 3, 5})
                                 .reshape({B, G * G, 3 * P * P});
  at::Tensor x = at::matmul(patches, patch_w_.t());  // [B, G*G, dim]
  x = at::cat({cls_.expand({B, 1, cfg_.dim}), x}, 1) + pos_;
  x = layer_norm(x, pre_w_, pre_b_);
  for (const Block& blk : blocks_) {
    x = x + attention(layer_norm(x, blk.norm1_w, blk.norm1_b), blk);
    const at::Tensor h = at::gelu(at::linear(layer_norm(x, blk.norm2_w, blk.norm2_b), blk.fc1_w,
                                             blk.fc1_b));
    x = x + at::linear(h, blk.fc2_w, blk.fc2_b);
  }
  return x;
}

}  // namespace wm::dit
