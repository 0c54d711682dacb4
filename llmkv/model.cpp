#include "llmkv/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <tuple>
#include <vector>

#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm::llm {
namespace nn = torch::nn;

// The RECORD_USER_SCOPE marks ("wm.llm.*": projections, norms, RoPE, attention, the window, the
// LM head) let an observer (wm_bench_llm --profile) attribute a step's time; with none registered
// each costs a test of the callback lists.

namespace {

// A parameter of `shape`: uninitialised, or as `fill` starts it (in float32, then converted, so
// that the default start draws the same numbers whatever the dtype).
template <class Fill>
at::Tensor make_param(at::IntArrayRef shape, const ParamAlloc& alloc, Fill fill) {
  at::NoGradGuard no_grad;
  if (alloc.init == ParamInit::Uninitialised) return at::empty(shape, at::TensorOptions().dtype(alloc.dtype));
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  fill(t);
  return alloc.dtype == at::kFloat ? t : t.to(alloc.dtype);
}

// Hugging Face's rotate-half RoPE on x [..., n, H, d] (token-major, heads inside) with cos/sin
// [n, d/2]: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) on the two halves of the head dim.
// Out of place (autograd-friendly); the result is contiguous [..., n, H, d].
// The same on float32 CPU tensors without autograd, in one pass: each element's two products
// and their difference or sum rounded as the tensor ops round them (volatile: never fused into a
// multiply-add), so the bits are the ops'; a decode step otherwise spends some ten tensor ops a
// call on a few hundred values.
bool rope_half_one_pass_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
         sin.scalar_type() == at::kFloat && cos.device().is_cpu() && sin.device().is_cpu() && x.dim() >= 3 &&
         x.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() && x.size(-1) % 2 == 0 &&
         x.size(-3) == cos.size(0) && !(at::GradMode::is_enabled() && x.requires_grad());
}

at::Tensor rope_half_one_pass(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t d = x.size(-1), h = d / 2, heads = x.size(-2), n = x.size(-3);
  at::Tensor y = at::empty_like(x);
  const float* xs = x.data_ptr<float>();
  const float *cs = cos.data_ptr<float>(), *ss = sin.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  const int64_t rows = x.numel() / d;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = (r / heads) % n;
    const float *xr = xs + r * d, *c = cs + t * h, *s = ss + t * h;
    float* yr = ys + r * d;
    for (int64_t i = 0; i < h; ++i) {
      volatile float a = xr[i] * c[i], b = xr[h + i] * s[i], e = xr[h + i] * c[i], f = xr[i] * s[i];
      yr[i] = a - b;
      yr[h + i] = e + f;
    }
  }
  return y;
}

at::Tensor rope_half(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  RECORD_USER_SCOPE("wm.llm.rope");
  if (rope_half_one_pass_applies(x, cos, sin)) return rope_half_one_pass(x, cos, sin);
  const int64_t h = x.size(-1) / 2;
  at::Tensor c = cos.unsqueeze(-2), s = sin.unsqueeze(-2);  // [n, 1, d/2]
  at::Tensor x1 = x.narrow(-1, 0, h), x2 = x.narrow(-1, h, h);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

// [..., n, heads * d] -> [..., n, heads, d] (a view).
at::Tensor split_heads(const at::Tensor& y, int64_t heads, int64_t d) {
  auto shape = y.sizes().vec();
  shape.back() = heads;
  shape.push_back(d);
  return y.view(shape);
}

// Products of one x by several projections (Q, K and V; gate and up), as linear_many gives them:
// one job of the decode kernels' threads (one hand-over, x converted or quantized once) where the
// projections keep their weights alike (float of one dtype, int8, or GGUF blocks); else each
// projection's forward(). The values are the separate products'.
std::vector<at::Tensor> project_many(const at::Tensor& x, std::initializer_list<LlmLinearImpl*> ps) {
  RECORD_USER_SCOPE("wm.llm.proj");
  bool int8 = true, blocks = true, plain = true;
  std::vector<at::Tensor> biases;
  for (const LlmLinearImpl* p : ps) {
    int8 = int8 && p->q8.defined();
    blocks = blocks && p->qw.defined();
    plain = plain && !p->q8.defined() && !p->qw.defined();
    biases.push_back(p->bias);
  }
  if (int8 || blocks || plain) {
    std::vector<Int8Weight> q8;
    std::vector<QuantWeight> qw;
    std::vector<at::Tensor> w;
    for (const LlmLinearImpl* p : ps) {
      if (int8) q8.push_back(p->q8);
      if (blocks) qw.push_back(p->qw);
      if (plain) w.push_back(p->weight);
    }
    return int8 ? linear_many(x, q8, biases) : blocks ? linear_many(x, qw, biases) : linear_many(x, w, biases);
  }
  std::vector<at::Tensor> ys;
  for (LlmLinearImpl* p : ps) ys.push_back(p->forward(x));
  return ys;
}

bool same_rope(const RopeSpec& a, const RopeSpec& b) {
  if (a.style != b.style || a.axes.size() != b.axes.size()) return false;
  for (size_t i = 0; i < a.axes.size(); ++i)
    if (a.axes[i].channels != b.axes[i].channels || a.axes[i].theta != b.axes[i].theta) return false;
  return true;
}

}  // namespace

LlmRmsNormImpl::LlmRmsNormImpl(int64_t dim, double eps_, ParamAlloc alloc) : eps(eps_) {
  weight = register_parameter("weight", make_param({dim}, alloc, [](at::Tensor& t) { t.fill_(1.0); }));
}

// torch::nn::Linear's start: Kaiming-uniform weights (a = sqrt(5)), biases uniform in
// +-1/sqrt(in), drawn in that order from libtorch's default generator.
LlmLinearImpl::LlmLinearImpl(int64_t in, int64_t out, bool with_bias, ParamAlloc alloc) {
  weight = register_parameter("weight", make_param({out, in}, alloc, [](at::Tensor& t) {
                                torch::nn::init::kaiming_uniform_(t, std::sqrt(5));
                              }));
  if (with_bias) {
    const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
    bias = register_parameter("bias", make_param({out}, alloc, [&](at::Tensor& t) {
                                torch::nn::init::uniform_(t, -bound, bound);
                              }));
  }
}

at::Tensor LlmLinearImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE("wm.llm.proj");
  if (q8.defined()) return wm::llm::linear(x, q8, bias);
  if (qw.defined()) return wm::llm::linear(x, qw, bias);
  return wm::llm::linear(x, weight, bias);
}

void LlmLinearImpl::set_quant(QuantWeight w) {
  WM_CHECK(w.defined() && weight.dim() == 2 && w.out == weight.size(0) && w.in == weight.size(1),
           "a quantized weight of [", w.out, ", ", w.in, "] for a projection of ", weight.sizes());
  WM_CHECK(!q8.defined(), "the projection's weight is int8 already");
  qw = std::move(w);
  weight.set_(at::empty({0}, weight.options()));
}

void LlmLinearImpl::quantize_int8() {
  if (q8.defined()) return;
  at::NoGradGuard no_grad;
  q8 = Int8Weight::quantize(weight);
  // Frees the float copy; the parameter stays registered (empty) so that module walks still work.
  weight.set_(at::empty({0}, weight.options()));
}

// torch::nn::Embedding's start: standard normal.
LlmEmbeddingImpl::LlmEmbeddingImpl(int64_t vocab, int64_t dim, ParamAlloc alloc) {
  weight = register_parameter("weight", make_param({vocab, dim}, alloc, [](at::Tensor& t) {
                                torch::nn::init::normal_(t);
                              }));
}

at::Tensor LlmRmsNormImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE("wm.llm.norm");
  // A decoding step's few rows in float32 on the CPU: one pass a row instead of six tensor ops,
  // the mean of squares summed in float64 (llama.cpp's rms_norm sums in double too), then the
  // float32 steps as below.
  const int64_t dim = weight.numel();
  if (x.device().is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.dim() >= 1 &&
      x.size(-1) == dim && dim > 0 && x.numel() <= 8 * dim && x.is_contiguous() && weight.is_contiguous() &&
      !(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()))) {
    at::Tensor y = at::empty_like(x);
    const float *xs = x.data_ptr<float>(), *w = weight.data_ptr<float>();
    float* ys = y.data_ptr<float>();
    for (int64_t r = 0; r < x.numel() / dim; ++r) {
      const float* xr = xs + r * dim;
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i] * xr[i]);
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + static_cast<float>(eps));
      for (int64_t i = 0; i < dim; ++i) ys[r * dim + i] = w[i] * (xr[i] * inv);
    }
    return y;
  }
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return weight * y.to(x.scalar_type());
}

LlmAttentionImpl::LlmAttentionImpl(const LlmConfig& c, ParamAlloc a) {
  const int64_t q_out = c.num_attention_heads * c.head_dim, kv_out = c.num_key_value_heads * c.head_dim;
  q_proj = register_module("q_proj", LlmLinear(c.hidden_size, q_out, c.qkv_bias(), a));
  k_proj = register_module("k_proj", LlmLinear(c.hidden_size, kv_out, c.qkv_bias(), a));
  v_proj = register_module("v_proj", LlmLinear(c.hidden_size, kv_out, c.qkv_bias(), a));
  o_proj = register_module("o_proj", LlmLinear(q_out, c.hidden_size, c.o_proj_bias(), a));
}

LlmMlpImpl::LlmMlpImpl(const LlmConfig& c, ParamAlloc a) {
  gate_proj = register_module("gate_proj", LlmLinear(c.hidden_size, c.intermediate_size, c.mlp_bias, a));
  up_proj = register_module("up_proj", LlmLinear(c.hidden_size, c.intermediate_size, c.mlp_bias, a));
  down_proj = register_module("down_proj", LlmLinear(c.intermediate_size, c.hidden_size, c.mlp_bias, a));
}

at::Tensor LlmMlpImpl::forward(const at::Tensor& x) {
  const std::vector<at::Tensor> gu = project_many(x, {gate_proj.get(), up_proj.get()});
  return down_proj->forward(at::silu(gu[0]) * gu[1]);
}

LlmLayerImpl::LlmLayerImpl(const LlmConfig& c, ParamAlloc a) {
  input_layernorm = register_module("input_layernorm", LlmRmsNorm(c.hidden_size, c.rms_norm_eps, a));
  self_attn = register_module("self_attn", LlmAttention(c, a));
  post_attention_layernorm = register_module("post_attention_layernorm", LlmRmsNorm(c.hidden_size, c.rms_norm_eps, a));
  mlp = register_module("mlp", LlmMlp(c, a));
}

LlmBodyImpl::LlmBodyImpl(const LlmConfig& c, ParamAlloc a) {
  embed_tokens = register_module("embed_tokens", LlmEmbedding(c.vocab_size, c.hidden_size, a));
  layers = register_module("layers", nn::ModuleList());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) layers->push_back(LlmLayer(c, a));
  norm = register_module("norm", LlmRmsNorm(c.hidden_size, c.rms_norm_eps, a));
}

LlmModelImpl::LlmModelImpl(LlmConfig cfg, ParamAlloc alloc) : cfg_(std::move(cfg)) {
  cfg_.validate();
  WM_CHECK(alloc.dtype == at::kFloat || alloc.dtype == at::kHalf || alloc.dtype == at::kBFloat16,
           "parameters must be float32, float16 or bfloat16, got ", c10::toString(alloc.dtype));
  rope_ = RopeSpec::text1d(static_cast<int>(cfg_.head_dim), cfg_.rope_theta, RopeStyle::Half);
  model = register_module("model", LlmBody(cfg_, alloc));
  if (!cfg_.tie_word_embeddings)
    lm_head = register_module("lm_head", LlmLinear(cfg_.hidden_size, cfg_.vocab_size, false, alloc));
}

at::Device LlmModelImpl::device() const { return model->embed_tokens->weight.device(); }
at::ScalarType LlmModelImpl::dtype() const { return model->embed_tokens->weight.scalar_type(); }

LlmLayerImpl& LlmModelImpl::layer(int l) {
  WM_CHECK(l >= 0 && l < cfg_.num_hidden_layers, "layer ", l, " out of range [0, ", cfg_.num_hidden_layers, ")");
  return *model->layers[l]->as<LlmLayerImpl>();
}

KvSpec LlmModelImpl::kv_spec(at::Device device, at::ScalarType dtype) const {
  KvSpec s;
  s.n_layers = static_cast<int>(cfg_.num_hidden_layers);
  s.n_kv_heads = static_cast<int>(cfg_.num_key_value_heads);
  s.head_dim = static_cast<int>(cfg_.head_dim);
  s.dtype = dtype;
  s.device = device;
  s.rope = rope_;
  return s;
}

at::Tensor LlmModelImpl::embed(const at::Tensor& tokens) {
  WM_CHECK(tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt, "token ids must be int64, got ",
           tokens.scalar_type());
  at::Tensor t = tokens.to(device(), at::kLong);
  if (t.numel() > 0) {
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    WM_CHECK(lo >= 0 && hi < cfg_.vocab_size, "token ids must be in [0, ", cfg_.vocab_size, "), got [", lo, ", ",
             hi, "]");
  }
  if (embed_q_.defined()) {  // the rows the tokens name, decoded from their blocks
    auto shape = t.sizes().vec();
    shape.push_back(embed_q_.in);
    const at::Tensor flat = t.reshape({-1}).to(at::kCPU);
    if (flat.numel() == 0) return at::empty(shape, at::TensorOptions().dtype(dtype()));
    const at::Tensor rows = embed_q_.blocks.index_select(0, flat).contiguous();
    return QuantWeight::from_blocks(embed_q_.type, flat.numel(), embed_q_.in, rows).dequantize(dtype()).reshape(shape);
  }
  return at::embedding(model->embed_tokens->weight, t);
}

void LlmModelImpl::set_quant_weight(const std::string& name, QuantWeight w) {
  WM_CHECK(device().is_cpu() && dtype() == at::kFloat, "quantized weights run in float32 on the CPU");
  WM_CHECK(!int8_, "the model's weights are int8 already");
  if (name == "model.embed_tokens.weight") {
    at::Tensor& e = model->embed_tokens->weight;
    WM_CHECK(w.defined() && e.dim() == 2 && w.out == e.size(0) && w.in == e.size(1), "a quantized embedding of [",
             w.out, ", ", w.in, "] for ", e.sizes());
    embed_q_ = std::move(w);
    e.set_(at::empty({0}, e.options()));
    quant_ = true;
    return;
  }
  const std::string suffix = ".weight";
  WM_CHECK(name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0,
           "set_quant_weight: '", name, "' is not a weight");
  const std::string module_name = name.substr(0, name.size() - suffix.size());
  for (const auto& m : named_modules()) {
    if (m.key() != module_name) continue;
    auto* lin = dynamic_cast<LlmLinearImpl*>(m.value().get());
    WM_CHECK(lin != nullptr, "set_quant_weight: '", name, "' is not a projection's weight");
    lin->set_quant(std::move(w));
    quant_ = true;
    return;
  }
  throw Error(str_cat("set_quant_weight: the model has no parameter '", name, "'"));
}

std::pair<at::Tensor, at::Tensor> LlmModelImpl::rope_cos_sin(const at::Tensor& pos) const {
  WM_CHECK(pos.dim() == 1, "positions must be [n], got ", pos.sizes());
  RECORD_USER_SCOPE("wm.llm.rope");
  // The core's angles (float64, exact for any position), in the model's dtype as Hugging Face
  // applies them.
  return wm::rope_cos_sin(pos.to(at::kLong).unsqueeze(1), rope_, device(), dtype());
}

Qkv LlmModelImpl::project(int l, const at::Tensor& x, const at::Tensor& pos) {
  auto [c, s] = rope_cos_sin(pos);
  return project(l, x, c, s);
}

Qkv LlmModelImpl::project(int l, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  LlmLayerImpl& L = layer(l);
  WM_CHECK(x.dim() >= 2 && x.size(-1) == cfg_.hidden_size, "x must be [..., n, ", cfg_.hidden_size, "], got ",
           x.sizes());
  const int64_t n = x.size(-2), d = cfg_.head_dim;
  WM_CHECK(cos.dim() == 2 && cos.size(0) == n && cos.size(1) == d / 2 && sin.sizes() == cos.sizes(),
           "cos/sin must be [", n, ", ", d / 2, "], got ", cos.sizes(), " and ", sin.sizes());
  at::Tensor h = L.input_layernorm->forward(x);
  auto& a = *L.self_attn;
  // RoPE on the token-major projections [..., n, H, d] (contiguous results), then a view puts
  // the heads first.
  const std::vector<at::Tensor> qkv = project_many(h, {a.q_proj.get(), a.k_proj.get(), a.v_proj.get()});
  at::Tensor q = rope_half(split_heads(qkv[0], cfg_.num_attention_heads, d), cos, sin);
  at::Tensor k = rope_half(split_heads(qkv[1], cfg_.num_key_value_heads, d), cos, sin);
  at::Tensor v = split_heads(qkv[2], cfg_.num_key_value_heads, d);
  return {q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2)};
}

at::Tensor LlmModelImpl::finish(int l, const at::Tensor& x, const at::Tensor& attn) {
  LlmLayerImpl& L = layer(l);
  const int64_t H = cfg_.num_attention_heads, d = cfg_.head_dim;
  WM_CHECK(attn.dim() == x.dim() + 1 && attn.size(-3) == H && attn.size(-1) == d && attn.size(-2) == x.size(-2),
           "attention output must be [..., ", H, ", ", x.size(-2), ", ", d, "] for x ", x.sizes(), ", got ",
           attn.sizes());
  auto shape = x.sizes().vec();
  shape.back() = H * d;
  at::Tensor merged = attn.transpose(-3, -2).reshape(shape);  // [..., n, H * d]
  at::Tensor h = x + L.self_attn->o_proj->forward(merged);
  return h + L.mlp->forward(L.post_attention_layernorm->forward(h));
}

at::Tensor LlmModelImpl::logits(const at::Tensor& normed) {
  RECORD_USER_SCOPE("wm.llm.lm_head");
  if (lm_head_q8_.defined()) return wm::llm::linear(normed, lm_head_q8_, at::Tensor()).to(at::kFloat);
  if (lm_head && lm_head->qw.defined()) return wm::llm::linear(normed, lm_head->qw, at::Tensor()).to(at::kFloat);
  if (!lm_head && embed_q_.defined()) return wm::llm::linear(normed, embed_q_, at::Tensor()).to(at::kFloat);
  const at::Tensor& w = lm_head ? lm_head->weight : model->embed_tokens->weight;
  return wm::llm::linear(normed, w, at::Tensor()).to(at::kFloat);
}

std::pair<at::Tensor, at::Tensor> LlmModelImpl::head(const at::Tensor& x) {
  at::Tensor normed = model->norm->forward(x);
  return {normed, logits(normed)};
}

void LlmModelImpl::quantize_int8() {
  if (int8_) return;
  WM_CHECK(device().is_cpu(), "int8 weights run on the CPU; the model is on ", device());
  WM_CHECK(!quant_, "the model keeps GGUF's quantized weights: int8 would quantize them again (load them as float)");
  at::NoGradGuard no_grad;
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    LlmLayerImpl& L = layer(l);
    for (LlmLinearImpl* p : {L.self_attn->q_proj.get(), L.self_attn->k_proj.get(), L.self_attn->v_proj.get(),
                             L.self_attn->o_proj.get(), L.mlp->gate_proj.get(), L.mlp->up_proj.get(),
                             L.mlp->down_proj.get()})
      p->quantize_int8();
  }
  if (lm_head) {
    lm_head->quantize_int8();
    lm_head_q8_ = lm_head->q8;
  } else {
    lm_head_q8_ = Int8Weight::quantize(model->embed_tokens->weight);
  }
  int8_ = true;
}

int64_t LlmModelImpl::decode_weight_bytes() const {
  int64_t total = 0;
  for (const auto& item : named_parameters(true)) {
    if (item.key() == "model.embed_tokens.weight") continue;  // looked up, not streamed
    total += item.value().numel() * static_cast<int64_t>(item.value().element_size());
  }
  for (const auto& m : modules(false))
    if (auto* lin = dynamic_cast<const LlmLinearImpl*>(m.get())) total += lin->q8.bytes() + (lin->qw.defined() ? lin->qw.bytes() : 0);
  if (!lm_head) {
    const at::Tensor& e = model->embed_tokens->weight;
    total += lm_head_q8_.defined() ? lm_head_q8_.bytes()
             : embed_q_.defined()  ? embed_q_.bytes()
                                   : e.numel() * static_cast<int64_t>(e.element_size());
  }
  return total;
}

AttentionResult attend_per_head(const at::Tensor& q, const KvWindow::Staged& st, const AttentionOptions& ao,
                                bool one_token) {
  const int64_t H = q.size(0), KH = st.k.size(0), G = H / KH;
  if (one_token && decode_attention_applies(q, st.k, st.v)) {
    // The decode kernels take a log-weight row per kv head: one call.
    AttentionResult ar;
    std::tie(ar.out, ar.key_mass) =
        decode_attention(q, st.k, st.v, st.logw.to(at::kFloat).unsqueeze(0) + st.head_logw, ao.capture_mass);
    return ar;
  }
  std::vector<at::Tensor> outs, masses;
  for (int64_t h = 0; h < KH; ++h) {
    const at::Tensor qh = q.narrow(0, h * G, G), kh = st.k.narrow(0, h, 1), vh = st.v.narrow(0, h, 1);
    const at::Tensor lw = st.logw.to(at::kFloat) + st.head_logw.select(0, h);
    AttentionResult r = wm::attention(qh, kh, vh, lw, ao);
    outs.push_back(r.out);
    if (ao.capture_mass) masses.push_back(r.key_mass);
  }
  AttentionResult ar;
  ar.out = at::cat(outs, 0);
  if (ao.capture_mass) ar.key_mass = at::cat(masses, 0);
  return ar;
}

namespace {

// The current tokens' queries q [H, n, d] (model dtype) over a staged window layer: per kv head
// when the layer selects per head, the decode kernels for one token where they apply, else
// wm::attention in the window's dtype.
AttentionResult attend_staged(const at::Tensor& q_model, const KvWindow::Staged& st, const AttentionOptions& ao,
                              at::ScalarType wdt) {
  const int64_t n = q_model.size(1);
  const at::Tensor q = q_model.scalar_type() == wdt ? q_model : q_model.to(wdt);
  if (st.head_logw.defined()) return attend_per_head(q, st, ao, n == 1);
  AttentionResult ar;
  if (n == 1 && decode_attention_applies(q_model, st.k, st.v)) {
    // One token: the decode kernels read the window's K/V in place, in its dtype.
    std::tie(ar.out, ar.key_mass) = decode_attention(q_model, st.k, st.v, st.logw, ao.capture_mass);
    return ar;
  }
  return wm::attention(q, st.k, st.v, st.logw, ao);
}

}  // namespace

StepResult LlmModelImpl::step(const at::Tensor& tokens, const at::Tensor& pos, KvWindow& window,
                              const StepOptions& opt) {
  at::NoGradGuard no_grad;
  WM_CHECK(tokens.dim() == 1 && tokens.size(0) > 0, "tokens must be [n] with n > 0, got ", tokens.sizes());
  const int64_t n = tokens.size(0);
  WM_CHECK(pos.dim() == 1 && pos.size(0) == n, "positions must be [", n, "], got ", pos.sizes());
  const KvSpec& ws = window.spec();
  WM_CHECK(ws.n_layers == cfg_.num_hidden_layers && ws.n_kv_heads == cfg_.num_key_value_heads &&
               ws.head_dim == cfg_.head_dim && same_rope(ws.rope, rope_),
           "the window holds ", ws.n_layers, " layers of ", ws.n_kv_heads, " kv heads x ", ws.head_dim,
           " (or another RoPE); the model writes ", cfg_.num_hidden_layers, " x ", cfg_.num_key_value_heads, " x ",
           cfg_.head_dim);
  const at::Device dev = device();
  WM_CHECK(ws.device == dev, "the window is on ", ws.device, ", the model on ", dev);
  const std::string segment = opt.segment.empty() ? "tail" : opt.segment;
  const at::ScalarType mdt = dtype(), wdt = ws.dtype;

  at::Tensor pos_cpu = pos.to(at::kCPU, at::kLong);
  at::Tensor pos_window = pos_cpu.unsqueeze(1);  // [n, 1]: the window's one RoPE axis
  auto [cos, sin] = rope_cos_sin(pos_cpu);
  at::Tensor x = embed(tokens);  // [n, hidden]

  StepResult res;
  AttentionOptions ao;
  ao.mask.kind = AttentionMask::Causal;
  ao.capture_mass = opt.capture_mass;
  ao.mass_queries = opt.mass_queries;
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    Qkv p = project(l, x, cos, sin);  // q [H, n, d], k/v [KH, n, d]
    KvWindow::Staged st;
    {
      RECORD_USER_SCOPE("wm.llm.window");
      st = window.stage(l, p.k, p.v);
    }
    ao.n_window = st.n_window;
    AttentionResult ar;
    {
      RECORD_USER_SCOPE("wm.llm.attention");
      ar = attend_staged(p.q, st, ao, wdt);
    }
    if (opt.capture_mass) res.key_mass.push_back(ar.key_mass);
    if (opt.capture_query) {
      const int64_t H = p.q.size(0), KH = p.k.size(0);
      res.query.push_back(p.q.select(1, n - 1).to(at::kFloat).reshape({KH, H / KH, -1}).mean(1));
    }
    if (opt.capture_queries) {
      const int64_t H = p.q.size(0), KH = p.k.size(0);
      res.queries.push_back(p.q.to(at::kFloat).reshape({KH, H / KH, n, -1}).mean(1));
    }
    if (opt.append) {
      RECORD_USER_SCOPE("wm.llm.window");
      window.commit_staged(opt.region, segment, l, n, pos_window);
    }
    x = finish(l, x, wdt == mdt ? ar.out : ar.out.to(mdt));
  }
  at::Tensor normed = model->norm->forward(x);
  res.logits = logits(opt.all_logits ? normed : normed.narrow(0, n - 1, 1));
  res.hidden = normed.to(at::kFloat);
  return res;
}

namespace {

// The batched step's attention of layer l on its fast path (float32 windows on the CPU, the
// decode kernels): each sequence's new K/V row written straight into its window, every
// attention in one hand-over to the kernels' threads, the positions committed after. q [H, B, d],
// k/v [KH, B, d]; returns the outputs [B, H, d].
at::Tensor batch_attention_raw(const Qkv& p, int l, const std::vector<KvWindow*>& windows, const StepOptions& opt,
                               const std::string& segment, const at::Tensor& pos_rows, std::vector<StepResult>& res) {
  const int64_t B = static_cast<int64_t>(windows.size());
  const int64_t H = p.q.size(0), KH = p.k.size(0), d = p.q.size(2);
  RECORD_USER_SCOPE("wm.llm.attention");
  const at::Tensor qt = p.q.transpose(0, 1).contiguous();  // [B, H, d]
  const at::Tensor kc = p.k.contiguous(), vc = p.v.contiguous();  // [KH, B, d]
  const float *qp = qt.data_ptr<float>(), *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
  std::vector<DecodeSlot> slots(static_cast<size_t>(B));
  int64_t nk_max = 0;
  std::vector<KvWindow::RawStage> st(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    st[b] = windows[b]->stage_raw(l, 1);
    for (int64_t h = 0; h < KH; ++h) {
      std::memcpy(static_cast<float*>(st[b].k) + h * st[b].head_stride + st[b].n * d, kp + (h * B + b) * d,
                  sizeof(float) * d);
      std::memcpy(static_cast<float*>(st[b].v) + h * st[b].head_stride + st[b].n * d, vp + (h * B + b) * d,
                  sizeof(float) * d);
    }
    nk_max = std::max(nk_max, st[b].n + 1);
  }
  at::Tensor out = at::empty({B, H, d}, at::kFloat), scratch = at::empty({B, H, nk_max}, at::kFloat);
  for (int64_t b = 0; b < B; ++b)
    slots[b] = {qp + b * H * d,      st[b].k,       st[b].v,
                st[b].head_stride,   st[b].logw,    st[b].n + 1,
                out.data_ptr<float>() + b * H * d, scratch.data_ptr<float>() + b * H * nk_max};
  decode_attention_slots(slots, H, KH, d);
  for (int64_t b = 0; b < B; ++b) {
    if (opt.capture_query)
      res[b].query.push_back(p.q.narrow(1, b, 1).select(1, 0).to(at::kFloat).reshape({KH, H / KH, -1}).mean(1));
    windows[b]->commit_staged(opt.region, segment, l, 1, pos_rows.data_ptr<int64_t>() + b);
  }
  return out;
}

}  // namespace

std::vector<StepResult> LlmModelImpl::step_batch(const at::Tensor& tokens, const at::Tensor& pos,
                                                 const std::vector<KvWindow*>& windows, const StepOptions& opt) {
  at::NoGradGuard no_grad;
  const int64_t B = static_cast<int64_t>(windows.size());
  WM_CHECK(B > 0, "step_batch needs at least one sequence");
  WM_CHECK(tokens.dim() == 1 && tokens.size(0) == B, "tokens must be [", B, "] (one per window), got ",
           tokens.sizes());
  WM_CHECK(pos.dim() == 1 && pos.size(0) == B, "positions must be [", B, "], got ", pos.sizes());
  WM_CHECK(!opt.all_logits && !opt.capture_queries, "step_batch decodes one token a sequence: no all_logits or "
           "capture_queries");
  const at::Device dev = device();
  const at::ScalarType mdt = dtype();
  for (int64_t b = 0; b < B; ++b) {
    WM_CHECK(windows[b] != nullptr, "sequence ", b, " has no window");
    for (int64_t c = 0; c < b; ++c) WM_CHECK(windows[c] != windows[b], "sequences ", c, " and ", b, " share a window");
    const KvSpec& ws = windows[b]->spec();
    WM_CHECK(ws.n_layers == cfg_.num_hidden_layers && ws.n_kv_heads == cfg_.num_key_value_heads &&
                 ws.head_dim == cfg_.head_dim && same_rope(ws.rope, rope_) && ws.device == dev,
             "sequence ", b, ": the window's layout or device differs from the model's");
  }
  const std::string segment = opt.segment.empty() ? "tail" : opt.segment;
  at::Tensor pos_cpu = pos.to(at::kCPU, at::kLong);
  auto [cos, sin] = rope_cos_sin(pos_cpu);
  at::Tensor x = embed(tokens);  // [B, hidden]: the sequences' tokens as rows of one product
  std::vector<StepResult> res(B);
  AttentionOptions ao;
  ao.capture_mass = opt.capture_mass;
  ao.mass_queries = opt.mass_queries;
  // The fast path (a small model's step is otherwise mostly per-sequence tensor bookkeeping):
  // float32 on the CPU, the decode kernels on, no per-head log-weights, no key mass asked. Each
  // sequence's new K/V rows are written straight into its window, every attention runs in one
  // hand-over to the kernels' threads, and the positions are committed after.
  bool raw = dev.is_cpu() && mdt == at::kFloat && decode_kernels_on() && !opt.capture_mass && opt.append;
  for (int64_t b = 0; b < B && raw; ++b)
    raw = windows[b]->spec().dtype == at::kFloat && windows[b]->spec().rope.n_axes() == 1;
  const at::Tensor pos_rows = pos_cpu.contiguous();  // [B]: sequence b's one position
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    Qkv p = project(l, x, cos, sin);  // q [H, B, d], k/v [KH, B, d]: token b is sequence b's
    bool raw_layer = raw;
    for (int64_t b = 0; b < B && raw_layer; ++b) raw_layer = !windows[b]->has_head_logw(l);
    if (raw_layer) {
      x = finish(l, x, batch_attention_raw(p, l, windows, opt, segment, pos_rows, res).transpose(0, 1));
      continue;
    }
    std::vector<at::Tensor> outs;
    outs.reserve(B);
    for (int64_t b = 0; b < B; ++b) {
      KvWindow& w = *windows[b];
      const at::Tensor kb = p.k.narrow(1, b, 1), vb = p.v.narrow(1, b, 1), qb = p.q.narrow(1, b, 1);
      KvWindow::Staged st;
      {
        RECORD_USER_SCOPE("wm.llm.window");
        st = w.stage(l, kb, vb);
      }
      ao.n_window = st.n_window;
      AttentionResult ar;
      {
        RECORD_USER_SCOPE("wm.llm.attention");
        ar = attend_staged(qb, st, ao, w.spec().dtype);
      }
      if (opt.capture_mass) res[b].key_mass.push_back(ar.key_mass);
      if (opt.capture_query) {
        const int64_t H = qb.size(0), KH = kb.size(0);
        res[b].query.push_back(qb.select(1, 0).to(at::kFloat).reshape({KH, H / KH, -1}).mean(1));
      }
      if (opt.append) {
        RECORD_USER_SCOPE("wm.llm.window");
        w.commit_staged(opt.region, segment, l, 1, pos_cpu.narrow(0, b, 1).unsqueeze(1));
      }
      outs.push_back(ar.out.scalar_type() == mdt ? ar.out : ar.out.to(mdt));
    }
    x = finish(l, x, at::cat(outs, 1));
  }
  at::Tensor normed = model->norm->forward(x);
  at::Tensor lg = logits(normed);
  at::Tensor hidden = normed.to(at::kFloat);
  for (int64_t b = 0; b < B; ++b) {
    res[b].logits = lg.narrow(0, b, 1);
    res[b].hidden = hidden.narrow(0, b, 1);
  }
  return res;
}

at::Tensor LlmModelImpl::forward_train(const at::Tensor& tokens) {
  WM_CHECK(tokens.dim() == 2 && tokens.size(0) > 0 && tokens.size(1) > 0, "tokens must be [B, T], got ",
           tokens.sizes());
  WM_CHECK(!int8_, "training needs the float weights; this model's were quantised to int8");
  WM_CHECK(!quant_, "training needs the float weights; this model keeps GGUF's quantized blocks (load them as float)");
  const int64_t T = tokens.size(1);
  auto [cos, sin] = rope_cos_sin(at::arange(T, at::TensorOptions().dtype(at::kLong)));
  at::Tensor x = embed(tokens);  // [B, T, hidden]
  AttentionOptions ao;
  ao.mask.kind = AttentionMask::Causal;
  ao.n_window = 0;
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    Qkv p = project(l, x, cos, sin);  // q [B, H, T, d], k/v [B, KH, T, d]
    at::Tensor attn = wm::attention(p.q, p.k, p.v, at::Tensor(), ao).out;
    x = finish(l, x, attn);
  }
  return head(x).second;
}

void LlmModelImpl::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& item : named_parameters(true)) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = name.find("norm.weight") != std::string::npos;
    if (is_norm) {
      p.fill_(1.0);
    } else if (is_bias) {
      p.zero_();
    } else {
      at::Tensor tmp = at::empty(p.sizes(), at::TensorOptions().dtype(at::kFloat));
      tmp.normal_(0.0, cfg_.initializer_range, gen);
      p.copy_(tmp);
    }
  }
}

}  // namespace wm::llm
