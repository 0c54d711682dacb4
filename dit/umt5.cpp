#include "dit/umt5.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/container/functional.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <vector>

#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"

namespace wm::dit {
namespace {

// upstream's GELU module (t5.py), term for term: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
at::Tensor gelu_tanh(const at::Tensor& x) {
  return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
}

// fp16_clamp: float16 activations that overflowed are clamped to finfo.max - 1000.
at::Tensor fp16_clamp(const at::Tensor& x) {
  if (x.scalar_type() == at::kHalf && at::isinf(x).any().item<bool>()) {
    const double c = 65504.0 - 1000.0;
    return at::clamp(x, -c, c);
  }
  return x;
}

// torch.finfo(dtype).min.
double finfo_min(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return std::numeric_limits<float>::lowest();
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kHalf: return -65504.0;
    case at::kBFloat16: return -3.3895313892515355e38;
    default: throw Error(str_cat("umT5 attention: unsupported dtype ", t));
  }
}

}  // namespace

Umt5Config umt5_xxl_config() { return Umt5Config{}; }

at::Tensor umt5_relative_position_bucket(const at::Tensor& rel_pos, int64_t num_buckets, bool bidirectional,
                                         int64_t max_dist) {
  TORCH_CHECK(rel_pos.scalar_type() == at::kLong, "umt5_relative_position_bucket: rel_pos must be int64");
  at::Tensor rel = rel_pos, buckets;
  int64_t nb = num_buckets;
  if (bidirectional) {
    nb = num_buckets / 2;
    buckets = (rel > 0).to(at::kLong) * nb;
    rel = at::abs(rel);
  } else {
    buckets = at::zeros_like(rel);
    rel = -at::min(rel, at::zeros_like(rel));
  }
  const int64_t max_exact = nb / 2;
  at::Tensor large =
      max_exact + (at::log(rel.to(at::kFloat) / max_exact) / std::log(static_cast<double>(max_dist) / max_exact) *
                   (nb - max_exact))
                      .to(at::kLong);
  large = at::min(large, at::full_like(large, nb - 1));
  return buckets + at::where(rel < max_exact, rel, large);
}

Umt5LinearImpl::Umt5LinearImpl(int64_t in, int64_t out, const at::TensorOptions& opt) {
  weight = register_parameter("weight", at::empty({out, in}, opt), false);
}
at::Tensor Umt5LinearImpl::forward(const at::Tensor& x) { return at::linear(x, weight); }

Umt5EmbeddingImpl::Umt5EmbeddingImpl(int64_t rows, int64_t dim, const at::TensorOptions& opt) {
  weight = register_parameter("weight", at::empty({rows, dim}, opt), false);
}
at::Tensor Umt5EmbeddingImpl::forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

Umt5LayerNormImpl::Umt5LayerNormImpl(int64_t dim, double eps_, const at::TensorOptions& opt) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}, opt), false);
}

at::Tensor Umt5LayerNormImpl::forward(const at::Tensor& x) {
  at::Tensor y = x * at::rsqrt(x.to(at::kFloat).pow(2).mean(-1, true) + eps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) y = y.to(weight.scalar_type());
  return weight * y;
}

Umt5RelativeEmbeddingImpl::Umt5RelativeEmbeddingImpl(const Umt5Config& c, const at::TensorOptions& opt)
    : num_buckets(c.num_buckets), max_dist(c.max_dist) {
  embedding = register_module("embedding", Umt5Embedding(c.num_buckets, c.num_heads, opt));
}

at::Tensor Umt5RelativeEmbeddingImpl::forward(int64_t lq, int64_t lk) {
  const auto dev = embedding->weight.device();
  const at::Tensor rel = at::arange(lk, at::TensorOptions(at::kLong).device(dev)).unsqueeze(0) -
                         at::arange(lq, at::TensorOptions(at::kLong).device(dev)).unsqueeze(1);
  const at::Tensor b = umt5_relative_position_bucket(rel, num_buckets, true, max_dist);
  return embedding->forward(b).permute({2, 0, 1}).unsqueeze(0).contiguous();  // [1, N, lq, lk]
}

Umt5AttentionImpl::Umt5AttentionImpl(const Umt5Config& c, const at::TensorOptions& opt)
    : num_heads(c.num_heads), head_dim(c.head_dim()) {
  WM_CHECK(c.dim_attn % c.num_heads == 0, "dim_attn ", c.dim_attn, " is not a multiple of num_heads ", c.num_heads);
  q = register_module("q", Umt5Linear(c.dim, c.dim_attn, opt));
  k = register_module("k", Umt5Linear(c.dim, c.dim_attn, opt));
  v = register_module("v", Umt5Linear(c.dim, c.dim_attn, opt));
  o = register_module("o", Umt5Linear(c.dim_attn, c.dim, opt));
}

at::Tensor Umt5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& mask, const at::Tensor& pos_bias) {
  const int64_t b = x.size(0), n = num_heads, c = head_dim;
  const at::Tensor qh = q->forward(x).view({b, -1, n, c}).transpose(1, 2);  // [B, N, Lq, C]
  const at::Tensor kh = k->forward(x).view({b, -1, n, c}).transpose(1, 2);
  const at::Tensor vh = v->forward(x).view({b, -1, n, c}).transpose(1, 2);
  at::Tensor bias = at::zeros({b, n, qh.size(2), kh.size(2)}, x.options());
  if (pos_bias.defined()) bias += pos_bias;
  if (mask.defined()) {
    WM_CHECK(mask.dim() == 2 || mask.dim() == 3, "mask must be [B, Lk] or [B, Lq, Lk], got ", mask.sizes());
    const at::Tensor m = mask.dim() == 2 ? mask.view({b, 1, 1, -1}) : mask.unsqueeze(1);
    bias.masked_fill_(m == 0, finfo_min(x.scalar_type()));
  }
  // T5 does not scale the logits.
  at::Tensor attn = at::matmul(qh, kh.transpose(-1, -2)) + bias;
  attn = at::softmax(attn.to(at::kFloat), -1).to(attn.scalar_type());
  const at::Tensor out = at::matmul(attn, vh).transpose(1, 2).reshape({b, -1, n * c});
  return o->forward(out);
}

Umt5FeedForwardImpl::Umt5FeedForwardImpl(const Umt5Config& c, const at::TensorOptions& opt) {
  gate = register_module("gate", torch::nn::Sequential(Umt5Linear(c.dim, c.dim_ffn, opt),
                                                        torch::nn::Functional(gelu_tanh)));
  fc1 = register_module("fc1", Umt5Linear(c.dim, c.dim_ffn, opt));
  fc2 = register_module("fc2", Umt5Linear(c.dim_ffn, c.dim, opt));
}

at::Tensor Umt5FeedForwardImpl::forward(const at::Tensor& x) {
  return fc2->forward(fc1->forward(x) * gate->forward(x));
}

Umt5BlockImpl::Umt5BlockImpl(const Umt5Config& c, const at::TensorOptions& opt) {
  norm1 = register_module("norm1", Umt5LayerNorm(c.dim, c.eps, opt));
  attn = register_module("attn", Umt5Attention(c, opt));
  norm2 = register_module("norm2", Umt5LayerNorm(c.dim, c.eps, opt));
  ffn = register_module("ffn", Umt5FeedForward(c, opt));
  pos_embedding = register_module("pos_embedding", Umt5RelativeEmbedding(c, opt));
}

at::Tensor Umt5BlockImpl::forward(const at::Tensor& x_in, const at::Tensor& mask) {
  const at::Tensor e = pos_embedding->forward(x_in.size(1), x_in.size(1));
  at::Tensor x = fp16_clamp(x_in + attn->forward(norm1->forward(x_in), mask, e));
  return fp16_clamp(x + ffn->forward(norm2->forward(x)));
}

Umt5EncoderImpl::Umt5EncoderImpl(const Umt5Config& c, const at::TensorOptions& opt) : config(c) {
  WM_CHECK(c.num_layers >= 1 && c.num_buckets >= 4 && c.max_dist > c.num_buckets / 4,
           "bad umT5 config: layers ", c.num_layers, ", buckets ", c.num_buckets, ", max_dist ", c.max_dist);
  token_embedding = register_module("token_embedding", Umt5Embedding(c.vocab, c.dim, opt));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) blocks->push_back(Umt5Block(c, opt));
  norm = register_module("norm", Umt5LayerNorm(c.dim, c.eps, opt));
}

at::Tensor Umt5EncoderImpl::forward(const at::Tensor& ids, const at::Tensor& mask) {
  WM_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "ids must be [B, L] int64, got ", ids.sizes(), " ",
           ids.scalar_type());
  WM_CHECK(!mask.defined() || mask.sizes() == ids.sizes(), "mask must be [B, L] like ids ", ids.sizes(), ", got ",
           mask.sizes());
  at::Tensor x = token_embedding->forward(ids);
  for (const auto& m : *blocks) x = m->as<Umt5Block>()->forward(x, mask);
  return norm->forward(x);
}

// ---- loading ----------------------------------------------------------------------------------

namespace {

// The tensors of a safetensors file or a .pth by name: shape and dtype before any data is read.
struct CheckpointTensors {
  struct Info {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t pth_index = 0;
  };
  std::string path;
  std::map<std::string, Info> info;
  std::optional<SafeTensors> st;
  std::optional<PthFile> pth;

  explicit CheckpointTensors(const std::string& p) : path(p) {
    switch (sniff_checkpoint_format(p)) {
      case CheckpointFormat::Safetensors:
        st = SafeTensors::open(p);
        for (const auto& n : st->names()) info[n] = {st->entry(n).dtype, st->entry(n).shape, 0};
        return;
      case CheckpointFormat::PthZip:
      case CheckpointFormat::PthLegacy:  // PthFile::open refuses it by name
        pth = PthFile::open(p);
        for (size_t i = 0; i < pth->tensors().size(); ++i)
          info[pth->tensors()[i].name] = {pth->tensors()[i].dtype, pth->tensors()[i].shape, i};
        return;
      case CheckpointFormat::Unknown: break;
    }
    throw CorruptData(str_cat(p, ": neither a safetensors file nor a torch.save (.pth) zip archive"));
  }

  const Info& at_key(const std::string& key) const {
    auto it = info.find(key);
    if (it == info.end()) throw Error(str_cat(path, ": missing tensor '", key, "' (umT5 encoder)"));
    return it->second;
  }
  at::Tensor get(const std::string& key) const { return st ? st->get(key) : pth->get(at_key(key).pth_index); }
};

}  // namespace

Umt5Config umt5_config_from_checkpoint(const std::string& path) {
  const CheckpointTensors ck(path);
  if (ck.info.count("pos_embedding.embedding.weight"))
    throw Error(str_cat(path, ": a position bias shared by all blocks ('pos_embedding.embedding.weight'): a T5 "
                              "encoder, not umT5's (one bias a block)"));
  Umt5Config c;
  auto shape2 = [&](const std::string& key) {
    const auto& s = ck.at_key(key).shape;
    if (s.size() != 2) throw Error(str_cat(path, ": tensor '", key, "' has shape ", at::IntArrayRef(s), ", expected 2-D"));
    return s;
  };
  c.vocab = shape2("token_embedding.weight")[0];
  c.dim = shape2("token_embedding.weight")[1];
  c.dim_attn = shape2("blocks.0.attn.q.weight")[0];
  c.dim_ffn = shape2("blocks.0.ffn.fc1.weight")[0];
  c.num_buckets = shape2("blocks.0.pos_embedding.embedding.weight")[0];
  c.num_heads = shape2("blocks.0.pos_embedding.embedding.weight")[1];
  const std::regex block_key(R"(^blocks\.(\d+)\.)");
  std::set<int64_t> seen;
  for (const auto& kv : ck.info) {
    std::smatch m;
    if (std::regex_search(kv.first, m, block_key)) seen.insert(std::stoll(m[1].str()));
  }
  c.num_layers = static_cast<int64_t>(seen.size());
  if (seen.empty() || *seen.rbegin() != c.num_layers - 1)
    throw Error(str_cat(path, ": block numbers are not 0..", c.num_layers - 1));
  if (c.dim_attn % c.num_heads != 0)
    throw Error(str_cat(path, ": dim_attn ", c.dim_attn, " (blocks.0.attn.q.weight) is not a multiple of the ",
                        c.num_heads, " heads of blocks.0.pos_embedding.embedding.weight"));
  return c;
}

void load_umt5_weights(Umt5EncoderImpl& enc, const std::string& path) {
  const CheckpointTensors ck(path);
  auto params = enc.named_parameters(true);
  for (const auto& p : params) {
    const auto& e = ck.at_key(p.key());
    if (!at::isFloatingType(e.dtype))
      throw Error(str_cat(path, ": tensor '", p.key(), "' is ", c10::toString(e.dtype),
                          ", a weight must be a floating-point type"));
    if (at::IntArrayRef(e.shape) != p.value().sizes())
      throw Error(str_cat(path, ": tensor '", p.key(), "' has shape ", at::IntArrayRef(e.shape),
                          ", the model expects ", p.value().sizes()));
  }
  for (const auto& kv : ck.info)
    if (!params.contains(kv.first))
      throw Error(str_cat(path, ": unexpected tensor '", kv.first, "' (not in the umT5 encoder)"));
  at::NoGradGuard ng;
  for (const auto& p : params) {
    const at::Tensor t = ck.get(p.key());
    if (!at::isfinite(t).all().item<bool>())
      throw Error(str_cat(path, ": tensor '", p.key(), "' holds non-finite values (NaN or inf)"));
    p.value().copy_(t);
  }
}

Umt5Encoder load_umt5_encoder(const std::string& path, at::Device device, at::ScalarType dtype) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
           "dtype must be float32, bfloat16 or float16, got ", dtype);
  Umt5Encoder enc(umt5_config_from_checkpoint(path), at::TensorOptions(dtype).device(device));
  load_umt5_weights(*enc, path);
  enc->eval();
  return enc;
}

at::Tensor umt5_context(Umt5EncoderImpl& enc, const at::Tensor& ids, const at::Tensor& mask) {
  WM_CHECK(ids.dim() == 2 && mask.sizes() == ids.sizes(), "ids and mask must be [B, L] alike, got ", ids.sizes(),
           " and ", mask.sizes());
  const at::Tensor m = mask.to(at::kCPU, at::kLong);
  const at::Tensor lens = m.ne(0).sum(1);
  at::NoGradGuard ng;
  const auto& w = enc.token_embedding->weight;
  at::Tensor out = at::zeros({ids.size(0), ids.size(1), enc.config.dim}, w.options());
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const int64_t n = lens[b].item<int64_t>();
    WM_CHECK(n >= 1 && m[b].narrow(0, 0, n).ne(0).all().item<bool>(),
             "mask row ", b, " must be 1 on a non-empty prefix (as the tokenizer makes it)");
    const at::Tensor x = ids[b].narrow(0, 0, n).unsqueeze(0).to(w.device());
    out[b].narrow(0, 0, n).copy_(enc.forward(x)[0]);
  }
  return out;
}

}  // namespace wm::dit
