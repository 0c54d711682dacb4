#include "llmkv/bert.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/options/embedding.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/options/normalization.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "llmkv/json_file.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::llm {
namespace nn = torch::nn;
using nlohmann::json;

namespace {

[[noreturn]] void field_error(const std::string& where, const std::string& field, const std::string& msg) {
  throw Error(str_cat(where, ": field '", field, "': ", msg));
}

// An integer field in [lo, hi]; `dflt` when absent or null, or an error when required.
int64_t int_field(const json& j, const char* key, int64_t lo, int64_t hi, const std::string& where,
                  std::optional<int64_t> dflt = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (!dflt) field_error(where, key, "missing (required)");
    return *dflt;
  }
  if (!it->is_number_integer()) field_error(where, key, str_cat("must be an integer, got ", it->dump()));
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi))
    field_error(where, key, str_cat("must be an integer in [", lo, ", ", hi, "], got ", it->dump()));
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) field_error(where, key, str_cat("must be an integer in [", lo, ", ", hi, "], got ", v));
  return v;
}

std::string string_field(const json& j, const char* key, const std::string& dflt, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_string()) field_error(where, key, str_cat("must be a string, got ", it->dump()));
  return it->get<std::string>();
}

bool bool_field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) field_error(where, key, str_cat("must be true or false, got ", it->dump()));
  return it->get<bool>();
}

nn::Linear linear(int64_t in, int64_t out) { return nn::Linear(nn::LinearOptions(in, out).bias(true)); }

nn::LayerNorm layer_norm(const BertConfig& c) {
  return nn::LayerNorm(nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps).elementwise_affine(true));
}

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

}  // namespace

BertConfig BertConfig::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(str_cat(where, ": expected a JSON object, got ", j.type_name()));
  const std::string type = string_field(j, "model_type", "", where);
  if (type != "bert") field_error(where, "model_type", str_cat("must be \"bert\", got \"", type, "\""));
  BertConfig c;
  c.vocab_size = int_field(j, "vocab_size", 1, int64_t(1) << 24, where);
  c.hidden_size = int_field(j, "hidden_size", 1, int64_t(1) << 16, where);
  c.num_hidden_layers = int_field(j, "num_hidden_layers", 1, 1024, where);
  c.num_attention_heads = int_field(j, "num_attention_heads", 1, 1024, where);
  c.intermediate_size = int_field(j, "intermediate_size", 1, int64_t(1) << 20, where);
  c.max_position_embeddings = int_field(j, "max_position_embeddings", 1, int64_t(1) << 20, where);
  c.type_vocab_size = int_field(j, "type_vocab_size", 1, 1024, where, 2);
  if (c.hidden_size % c.num_attention_heads != 0)
    field_error(where, "num_attention_heads",
                str_cat(c.num_attention_heads, " does not divide hidden_size ", c.hidden_size));
  if (auto it = j.find("layer_norm_eps"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) field_error(where, "layer_norm_eps", str_cat("must be a number, got ", it->dump()));
    c.layer_norm_eps = it->get<double>();
    if (!(c.layer_norm_eps > 0 && c.layer_norm_eps < 1))
      field_error(where, "layer_norm_eps", str_cat("must be in (0, 1), got ", it->dump()));
  }
  c.hidden_act = string_field(j, "hidden_act", "gelu", where);
  if (c.hidden_act != "gelu" && c.hidden_act != "gelu_new" && c.hidden_act != "gelu_pytorch_tanh")
    field_error(where, "hidden_act",
                str_cat("\"", c.hidden_act, "\" is not supported (gelu, gelu_new or gelu_pytorch_tanh)"));
  const std::string pos = string_field(j, "position_embedding_type", "absolute", where);
  if (pos != "absolute")
    field_error(where, "position_embedding_type", str_cat("\"", pos, "\" is not supported (only \"absolute\")"));
  for (const char* flag : {"is_decoder", "add_cross_attention"})
    if (bool_field(j, flag, where)) field_error(where, flag, "true is not supported (an encoder only)");
  return c;
}

BertConfig BertConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

// ---- modules ----

BertEmbeddingsImpl::BertEmbeddingsImpl(const BertConfig& c) {
  word_embeddings = register_module("word_embeddings", nn::Embedding(c.vocab_size, c.hidden_size));
  position_embeddings = register_module("position_embeddings", nn::Embedding(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings", nn::Embedding(c.type_vocab_size, c.hidden_size));
  LayerNorm = register_module("LayerNorm", layer_norm(c));
}

at::Tensor BertEmbeddingsImpl::forward(const at::Tensor& ids, const at::Tensor& type_ids) {
  const int64_t T = ids.size(1);
  const at::Tensor positions = at::arange(T, ids.options().dtype(at::kLong));
  at::Tensor e = word_embeddings->forward(ids) + token_type_embeddings->forward(type_ids) +
                 position_embeddings->forward(positions).unsqueeze(0);
  return LayerNorm->forward(e);
}

BertSelfAttentionImpl::BertSelfAttentionImpl(const BertConfig& c) {
  query = register_module("query", linear(c.hidden_size, c.hidden_size));
  key = register_module("key", linear(c.hidden_size, c.hidden_size));
  value = register_module("value", linear(c.hidden_size, c.hidden_size));
}

BertResidualOutputImpl::BertResidualOutputImpl(int64_t in, const BertConfig& c) {
  dense = register_module("dense", linear(in, c.hidden_size));
  LayerNorm = register_module("LayerNorm", layer_norm(c));
}

at::Tensor BertResidualOutputImpl::forward(const at::Tensor& x, const at::Tensor& residual) {
  return LayerNorm->forward(dense->forward(x) + residual);
}

BertAttentionImpl::BertAttentionImpl(const BertConfig& c) {
  self = register_module("self", BertSelfAttention(c));
  output = register_module("output", BertResidualOutput(c.hidden_size, c));
}

BertIntermediateImpl::BertIntermediateImpl(const BertConfig& c) {
  dense = register_module("dense", linear(c.hidden_size, c.intermediate_size));
}

BertLayerImpl::BertLayerImpl(const BertConfig& c) {
  attention = register_module("attention", BertAttention(c));
  intermediate = register_module("intermediate", BertIntermediate(c));
  output = register_module("output", BertResidualOutput(c.intermediate_size, c));
}

BertEncoderImpl::BertEncoderImpl(const BertConfig& c) {
  layer = register_module("layer", nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(BertLayer(c));
}

BertModelImpl::BertModelImpl(const BertConfig& c) : config_(c) {
  embeddings = register_module("embeddings", BertEmbeddings(c));
  encoder = register_module("encoder", BertEncoder(c));
}

at::Device BertModelImpl::device() const { return embeddings->word_embeddings->weight.device(); }

at::Tensor BertModelImpl::layer_forward(BertLayerImpl& l, const at::Tensor& x, const at::Tensor& bias) {
  const int64_t B = x.size(0), T = x.size(1), H = config_.num_attention_heads, d = config_.head_dim();
  BertSelfAttentionImpl& sa = *l.attention->self;
  auto heads = [&](const at::Tensor& y) { return y.view({B, T, H, d}).transpose(1, 2); };  // [B, H, T, d]
  const at::Tensor q = heads(sa.query->forward(x)), k = heads(sa.key->forward(x)), v = heads(sa.value->forward(x));
  const at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d)) + bias;
  const at::Tensor ctx = at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({B, T, H * d});
  const at::Tensor a = l.attention->output->forward(ctx, x);
  at::Tensor h = l.intermediate->dense->forward(a);
  h = config_.hidden_act == "gelu" ? at::gelu(h) : at::gelu(h, "tanh");
  return l.output->forward(h, a);
}

at::Tensor BertModelImpl::forward(const at::Tensor& ids, const at::Tensor& type_ids, const at::Tensor& mask) {
  WM_CHECK(ids.dim() == 2, "ids must be [B, T], got ", ids.sizes());
  WM_CHECK(type_ids.sizes() == ids.sizes() && mask.sizes() == ids.sizes(), "ids ", ids.sizes(), ", type_ids ",
           type_ids.sizes(), " and mask ", mask.sizes(), " must have one shape");
  const int64_t T = ids.size(1);
  WM_CHECK(T >= 1 && T <= config_.max_position_embeddings, "sequence length ", T, " must be in [1, ",
           config_.max_position_embeddings, "] (max_position_embeddings)");
  const at::Device dev = device();
  const at::ScalarType dtype = embeddings->word_embeddings->weight.scalar_type();
  const at::Tensor i = ids.to(dev, at::kLong), t = type_ids.to(dev, at::kLong);
  // Additive key bias [B, 1, 1, T]: 0 for tokens, the dtype's lowest value for padding (as
  // transformers; a row always has its first token, so no softmax row is all padding).
  const at::Tensor keep = mask.to(dev).ne(0).view({mask.size(0), 1, 1, T});
  const at::Tensor bias = at::zeros(keep.sizes(), at::TensorOptions().dtype(dtype).device(dev))
                              .masked_fill(keep.logical_not(), std::numeric_limits<float>::lowest());
  at::Tensor x = embeddings->forward(i, t);
  for (const auto& m : *encoder->layer) x = layer_forward(*m->as<BertLayer>(), x, bias);
  return x;
}

// ---- weights ----

void load_bert_weights(BertModelImpl& model, const std::string& path) {
  SafeTensors st = SafeTensors::open(path);  // CorruptData names the file
  const std::vector<std::string> names = st.names();
  bool prefixed = false;
  for (const auto& n : names) prefixed |= starts_with(n, "bert.");
  auto harmless = [](const std::string& n) { return starts_with(n, "pooler.") || n == "embeddings.position_ids"; };

  // The checkpoint's tensors by the model's names.
  std::map<std::string, std::string> stored;  // model name -> name in the file
  for (const auto& n : names) {
    if (prefixed && !starts_with(n, "bert."))
      throw Error(str_cat(path, ": unexpected tensor '", n, "' (shape ", at::IntArrayRef(st.entry(n).shape),
                          ") beside tensors named bert.*"));
    stored.emplace(prefixed ? n.substr(5) : n, n);
  }

  auto params = model.named_parameters(true);
  std::set<std::string> expected;
  for (const auto& p : params) {
    expected.insert(p.key());
    auto it = stored.find(p.key());
    if (it == stored.end())
      throw Error(str_cat(path, ": missing tensor '", prefixed ? "bert." : "", p.key(), "' (expected shape ",
                          p.value().sizes(), ")"));
    const auto& e = st.entry(it->second);
    if (at::IntArrayRef(e.shape) != p.value().sizes())
      throw Error(str_cat(path, ": tensor '", it->second, "' has shape ", at::IntArrayRef(e.shape), ", expected ",
                          p.value().sizes()));
    if (e.dtype != at::kFloat && e.dtype != at::kHalf && e.dtype != at::kBFloat16)
      throw Error(str_cat(path, ": tensor '", it->second, "' is stored as ", c10::toString(e.dtype),
                          "; the loader reads F32, F16 and BF16"));
  }
  for (const auto& [name, in_file] : stored)
    if (!expected.count(name) && !harmless(name))
      throw Error(str_cat(path, ": unexpected tensor '", in_file, "' (shape ", at::IntArrayRef(st.entry(in_file).shape),
                          ") not in a BERT encoder of ", model.config().num_hidden_layers, " layers"));

  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // read and checked before any parameter changes
  for (auto& p : params) {
    const std::string& in_file = stored.at(p.key());
    at::Tensor t = st.get(in_file);
    if (!at::isfinite(t).all().item<bool>())
      throw Error(str_cat(path, ": tensor '", in_file, "' holds ", (~at::isfinite(t)).sum().item<int64_t>(),
                          " non-finite values (NaN or inf)"));
    copies.emplace_back(p.value(), std::move(t));
  }
  at::NoGradGuard no_grad;
  for (auto& [param, t] : copies) param.copy_(t);  // converts the dtype, moves to the parameter's device
}

}  // namespace wm::llm
