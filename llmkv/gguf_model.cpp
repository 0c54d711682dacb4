#include "llmkv/gguf_model.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "llmkv/weight_shapes.h"
#include "runtime/error.h"
#include "llmkv/quant_gemv.h"
#include "runtime/gguf_quants.h"

namespace wm::llm {

namespace {

[[noreturn]] void refuse(const GgufFile& f, const std::string& what) { throw Error(str_cat(f.path(), ": ", what)); }

int64_t positive(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_i64(key);
  if (v <= 0) refuse(f, str_cat("key '", key, "' is ", v, ", not a positive count"));
  return v;
}

// The architecture's keys that would change the computation in a way this decoder does not run.
void refuse_unsupported_keys(const GgufFile& f, const std::string& a, int64_t head_dim) {
  const std::string scaling = a + ".rope.scaling.type";
  if (f.has(scaling) && f.get_string(scaling) != "none")
    refuse(f, str_cat("key '", scaling, "' is \"", f.get_string(scaling), "\": RoPE scaling is not supported"));
  if (f.has_tensor("rope_freqs.weight"))
    refuse(f, "tensor 'rope_freqs.weight' (Llama 3.1's RoPE frequency factors) is not supported");
  const std::string experts = a + ".expert_count";
  if (f.has(experts) && f.get_i64(experts) > 0) refuse(f, str_cat("key '", experts, "': mixtures of experts are not supported"));
  const std::string rope_dims = a + ".rope.dimension_count";
  if (f.has(rope_dims) && f.get_i64(rope_dims) != head_dim)
    refuse(f, str_cat("key '", rope_dims, "' is ", f.get_i64(rope_dims), ": RoPE over part of the head (head dim ",
                      head_dim, ") is not supported"));
  const std::string v_len = a + ".attention.value_length";
  if (f.has(v_len) && f.get_i64(v_len) != head_dim)
    refuse(f, str_cat("key '", v_len, "' is ", f.get_i64(v_len), ", not the key length ", head_dim));
}

// "model.layers.7.self_attn.q_proj.weight" -> "blk.7.attn_q.weight", and the top-level names.
std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> top = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                         {"model.norm.weight", "output_norm.weight"},
                                                         {"lm_head.weight", "output.weight"}};
  if (auto it = top.find(hf); it != top.end()) return it->second;
  static const std::string layers = "model.layers.";
  WM_CHECK(hf.rfind(layers, 0) == 0, "no GGUF name for parameter '", hf, "'");
  const size_t dot = hf.find('.', layers.size());
  const std::string n = hf.substr(layers.size(), dot - layers.size());
  const std::string rest = hf.substr(dot + 1);
  static const std::map<std::string, std::string> part = {
      {"input_layernorm", "attn_norm"},  {"self_attn.q_proj", "attn_q"},       {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},    {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},     {"mlp.up_proj", "ffn_up"},           {"mlp.down_proj", "ffn_down"}};
  const size_t last = rest.rfind('.');
  const auto it = part.find(rest.substr(0, last));
  WM_CHECK(it != part.end(), "no GGUF name for parameter '", hf, "'");
  return str_cat("blk.", n, ".", it->second, rest.substr(last));
}

std::vector<int64_t> torch_shape(const GgufTensor& t) { return {t.dims.rbegin(), t.dims.rend()}; }

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Each parameter's tensor, checked (present, shape, type) with nothing left over.
std::vector<std::pair<std::string, const GgufTensor*>> check_tensors(const GgufFile& f, const LlmConfig& cfg) {
  std::vector<std::pair<std::string, const GgufTensor*>> out;
  std::set<std::string> used;
  for (const auto& [name, shape] : llm_parameter_shapes(cfg)) {
    const std::string g = gguf_name(name);
    if (!f.has_tensor(g)) refuse(f, str_cat("tensor '", g, "' (", name, ") is missing"));
    const GgufTensor& t = f.tensor(g);
    if (torch_shape(t) != shape)
      refuse(f, str_cat("tensor '", g, "' is ", shape_text(torch_shape(t)), ", the config asks for ", shape_text(shape)));
    if (!quant_supported(t.type))
      refuse(f, str_cat("tensor '", g, "' is stored as ", ggml_type_name(t.type), ", a type this runtime does not decode"));
    used.insert(g);
    out.emplace_back(name, &t);
  }
  for (const auto& t : f.tensors())
    if (!used.count(t.name)) refuse(f, str_cat("tensor '", t.name, "' has no place in a ", cfg.model_type, " model"));
  return out;
}

}  // namespace

LlmConfig llm_config_from_gguf(const GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  if (a != "llama" && a != "qwen2")
    refuse(f, str_cat("architecture '", a, "' (general.architecture) is not one this runtime runs (llama, qwen2)"));
  LlmConfig c;
  c.model_type = a;
  c.num_hidden_layers = positive(f, a + ".block_count");
  c.hidden_size = positive(f, a + ".embedding_length");
  c.intermediate_size = positive(f, a + ".feed_forward_length");
  c.num_attention_heads = positive(f, a + ".attention.head_count");
  const std::string kv = a + ".attention.head_count_kv";
  c.num_key_value_heads = f.has(kv) ? positive(f, kv) : c.num_attention_heads;
  const std::string k_len = a + ".attention.key_length";
  c.head_dim = f.has(k_len) ? positive(f, k_len) : c.hidden_size / c.num_attention_heads;
  refuse_unsupported_keys(f, a, c.head_dim);
  c.rms_norm_eps = f.get_f64(a + ".attention.layer_norm_rms_epsilon");
  const std::string base = a + ".rope.freq_base";
  c.rope_theta = f.has(base) ? f.get_f64(base) : 10000.0;
  const std::string ctx = a + ".context_length";
  c.max_position_embeddings = f.has(ctx) ? positive(f, ctx) : 2048;
  const std::string vocab = a + ".vocab_size";
  c.vocab_size = f.has(vocab) ? positive(f, vocab)
                              : static_cast<int64_t>(f.value("tokenizer.ggml.tokens").count);
  c.tie_word_embeddings = !f.has_tensor("output.weight");
  c.attention_bias = a == "llama" && f.has_tensor("blk.0.attn_q.bias");
  c.mlp_bias = a == "llama" && f.has_tensor("blk.0.ffn_gate.bias");
  c.torch_dtype = "float32";
  if (f.has("tokenizer.ggml.bos_token_id")) c.bos_token_ids = {f.get_i64("tokenizer.ggml.bos_token_id")};
  if (f.has("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {f.get_i64("tokenizer.ggml.eos_token_id")};
  if (f.has("tokenizer.ggml.eot_token_id")) {
    const int64_t eot = f.get_i64("tokenizer.ggml.eot_token_id");
    if (c.eos_token_ids.empty() || c.eos_token_ids[0] != eot) c.eos_token_ids.push_back(eot);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    refuse(f, str_cat("the model its metadata describes is invalid: ", e.what()));
  }
  return c;
}

at::Tensor permute_qk_rows(const at::Tensor& w, int64_t n_heads) {
  std::vector<int64_t> shape = w.sizes().vec();
  WM_CHECK(!shape.empty() && n_heads > 0 && shape[0] % (2 * n_heads) == 0, "permute_qk_rows: ", shape_text(shape),
           " does not split into ", n_heads, " heads of an even size");
  std::vector<int64_t> split = {n_heads, 2, shape[0] / n_heads / 2};
  split.insert(split.end(), shape.begin() + 1, shape.end());
  return w.reshape(split).transpose(1, 2).reshape(shape).contiguous();
}

at::Tensor unpermute_qk_rows(const at::Tensor& w, int64_t n_heads) {
  std::vector<int64_t> shape = w.sizes().vec();
  WM_CHECK(!shape.empty() && n_heads > 0 && shape[0] % (2 * n_heads) == 0, "unpermute_qk_rows: ", shape_text(shape),
           " does not split into ", n_heads, " heads of an even size");
  std::vector<int64_t> split = {n_heads, shape[0] / n_heads / 2, 2};
  split.insert(split.end(), shape.begin() + 1, shape.end());
  return w.reshape(split).transpose(1, 2).reshape(shape).contiguous();
}

namespace {

// Which of a layer's weights llama.cpp's converter permuted, and over how many heads.
int64_t permuted_heads(const LlmConfig& cfg, const std::string& name) {
  if (cfg.model_type != "llama") return 0;
  if (name.find("self_attn.q_proj.") != std::string::npos) return cfg.num_attention_heads;
  if (name.find("self_attn.k_proj.") != std::string::npos) return cfg.num_key_value_heads;
  return 0;
}

// The tensor as blocks, rows in Hugging Face's order (a reordered copy for Llama's Q and K).
QuantWeight stored_weight(const std::shared_ptr<const GgufFile>& file, const GgufTensor& t, int64_t heads) {
  QuantWeight w = QuantWeight::from_gguf(file, t.name);
  if (heads == 0) return w;
  const at::Tensor order = unpermute_qk_rows(at::arange(w.out, at::kLong), heads);
  return QuantWeight::from_blocks(w.type, w.out, w.in, w.blocks.index_select(0, order).contiguous());
}

// Refuses a tensor holding NaN or inf, decoding it a slice of rows at a time into one buffer of
// about 4 MiB that every slice and tensor reuses (a new tensor a slice, with libtorch's
// temporaries for the test, left some 550 MiB of freed heap resident after loading Qwen2-0.5B's
// Q8_0 file: the process's anonymous memory, not the file's).
void check_finite(const GgufFile& f, const GgufTensor& t, std::vector<float>& buf) {
  const int64_t in = t.dims.empty() ? 1 : static_cast<int64_t>(t.dims[0]);
  const int64_t rows = in == 0 ? 0 : t.numel / in;
  const size_t row_bytes = rows == 0 ? 0 : t.nbytes / static_cast<size_t>(rows);
  const int64_t step = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(in, 1));
  buf.resize(static_cast<size_t>(std::min(step, rows) * in));
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t n = std::min(step, rows - r);
    dequantize(t.type, t.data + static_cast<size_t>(r) * row_bytes, n * in, buf.data());
    for (int64_t i = 0; i < n * in; ++i) bad += !std::isfinite(buf[static_cast<size_t>(i)]);
  }
  if (bad > 0) refuse(f, str_cat("tensor '", t.name, "' holds ", bad, " non-finite values (NaN or inf)"));
}

}  // namespace

LlmModel load_llm_gguf(const GgufFile& f, at::Device device, at::ScalarType dtype, GgufWeights weights) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
           "dtype must be float32, float16 or bfloat16, got ", c10::toString(dtype));
  const LlmConfig cfg = llm_config_from_gguf(f);
  const auto tensors = check_tensors(f, cfg);
  const bool stored = weights == GgufWeights::Stored && device.is_cpu() && dtype == at::kFloat;
  // Stored: the parameters are allocated but never written (their pages never become resident)
  // where the blocks take their place.
  const uint64_t bytes = stored ? f.data_size() : static_cast<uint64_t>(llm_parameter_count(cfg)) * c10::elementSize(dtype);
  check_fits_in_memory(bytes, str_cat("the model of ", f.path()), str_cat(f.path(), ": ", llm_size_fields(cfg)));
  LlmModel m(cfg, ParamAlloc{ParamInit::Uninitialised, dtype});
  auto params = m->named_parameters(true);
  const auto shared = std::make_shared<const GgufFile>(f);
  at::NoGradGuard no_grad;
  std::vector<float> finite_buf;
  for (const auto& [name, t] : tensors) {
    check_finite(f, *t, finite_buf);
    const int64_t heads = permuted_heads(cfg, name);
    if (stored && t->dims.size() == 2 && quant_kernels_support(t->type)) {
      m->set_quant_weight(name, stored_weight(shared, *t, heads));
      continue;
    }
    at::Tensor w = dequantize_tensor(t->type, t->data, t->nbytes, torch_shape(*t));
    if (heads > 0) w = unpermute_qk_rows(w, heads);
    at::Tensor* p = params.find(name);
    WM_CHECK(p != nullptr, "the model has no parameter '", name, "'");
    p->copy_(w);
  }
  m->to(device);
  m->eval();
  return m;
}

std::string gguf_model_name(const GgufFile& f) {
  if (f.has("general.name")) {
    const std::string n = f.get_string("general.name");
    if (!n.empty()) return n;
  }
  return std::filesystem::path(f.path()).stem().string();
}

}  // namespace wm::llm
