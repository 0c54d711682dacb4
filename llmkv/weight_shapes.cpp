#include "llmkv/weight_shapes.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>

#include "runtime/error.h"

namespace wm::llm {
namespace {

// A parameter with the config fields its dimensions come from ("vocab_size 2048 x hidden_size 128").
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  std::string fields;
};

std::vector<Param> params_of(const LlmConfig& c) {
  const std::string V = str_cat("vocab_size ", c.vocab_size), D = str_cat("hidden_size ", c.hidden_size);
  const std::string I = str_cat("intermediate_size ", c.intermediate_size);
  const std::string Q = str_cat("num_attention_heads ", c.num_attention_heads, " x head_dim ", c.head_dim);
  const std::string K = str_cat("num_key_value_heads ", c.num_key_value_heads, " x head_dim ", c.head_dim);
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::vector<Param> p;
  auto linear = [&](const std::string& pre, int64_t out, int64_t in, const std::string& fo, const std::string& fi,
                    bool bias) {
    p.push_back({pre + ".weight", {out, in}, fo + ", " + fi});
    if (bias) p.push_back({pre + ".bias", {out}, fo});
  };
  p.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, V + ", " + D});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = str_cat("model.layers.", l, ".");
    p.push_back({pre + "input_layernorm.weight", {c.hidden_size}, D});
    linear(pre + "self_attn.q_proj", q, c.hidden_size, Q, D, c.qkv_bias());
    linear(pre + "self_attn.k_proj", kv, c.hidden_size, K, D, c.qkv_bias());
    linear(pre + "self_attn.v_proj", kv, c.hidden_size, K, D, c.qkv_bias());
    linear(pre + "self_attn.o_proj", c.hidden_size, q, D, Q, c.o_proj_bias());
    p.push_back({pre + "post_attention_layernorm.weight", {c.hidden_size}, D});
    linear(pre + "mlp.gate_proj", c.intermediate_size, c.hidden_size, I, D, c.mlp_bias);
    linear(pre + "mlp.up_proj", c.intermediate_size, c.hidden_size, I, D, c.mlp_bias);
    linear(pre + "mlp.down_proj", c.hidden_size, c.intermediate_size, D, I, c.mlp_bias);
  }
  p.push_back({"model.norm.weight", {c.hidden_size}, D});
  if (!c.tie_word_embeddings) p.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}, V + ", " + D});
  return p;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += str_cat(i ? ", " : "", s[i]);
  return t + "]";
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string gib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return b;
}

// A number from the first line of a file ("max" or unreadable: none).
uint64_t read_limit(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return 0;
  try {
    return std::stoull(s);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

ParameterShapes llm_parameter_shapes(const LlmConfig& c) {
  ParameterShapes out;
  for (auto& p : params_of(c)) out.emplace_back(std::move(p.name), std::move(p.shape));
  return out;
}

int64_t llm_parameter_count(const LlmConfig& c) {
  // vocab <= 2^24, hidden <= 2^16, intermediate <= 2^20, layers <= 2^10, heads x head_dim <= 2^20:
  // the largest term is 2^10 x 3 x 2^20 x 2^16 = 3 x 2^46, far inside int64.
  const int64_t D = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  int64_t per_layer = 2 * D + q * D + 2 * kv * D + D * q + 3 * c.intermediate_size * D;
  if (c.qkv_bias()) per_layer += q + 2 * kv;
  if (c.o_proj_bias()) per_layer += D;
  if (c.mlp_bias) per_layer += 2 * c.intermediate_size + D;
  return c.vocab_size * D * (c.tie_word_embeddings ? 1 : 2) + c.num_hidden_layers * per_layer + D;
}

std::string llm_size_fields(const LlmConfig& c) {
  const int64_t D = c.hidden_size;
  std::vector<std::pair<int64_t, std::string>> parts = {
      {c.vocab_size * D * (c.tie_word_embeddings ? 1 : 2),
       str_cat("vocab_size ", c.vocab_size, " x hidden_size ", D, " (embeddings", c.tie_word_embeddings ? "" : " and LM head",
               ")")},
      {c.num_hidden_layers * 3 * c.intermediate_size * D,
       str_cat("num_hidden_layers ", c.num_hidden_layers, " x intermediate_size ", c.intermediate_size, " x hidden_size ", D,
               " (MLPs)")},
      {c.num_hidden_layers * 2 * (c.num_attention_heads + c.num_key_value_heads) * c.head_dim * D,
       str_cat("num_hidden_layers ", c.num_hidden_layers, " x (num_attention_heads ", c.num_attention_heads,
               " + num_key_value_heads ", c.num_key_value_heads, ") x head_dim ", c.head_dim, " x hidden_size ", D,
               " (attention)")}};
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (const auto& [n, text] : parts) s += (s.empty() ? "" : "; ") + text;
  return s;
}

uint64_t llm_context_bytes(const LlmConfig& c, int64_t tokens, int64_t chunk, size_t kv_element_bytes) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(tokens, 0));
  const uint64_t kv = n * static_cast<uint64_t>(c.num_hidden_layers) * 2 * static_cast<uint64_t>(c.num_key_value_heads) *
                      static_cast<uint64_t>(c.head_dim) * kv_element_bytes;
  const uint64_t scores = static_cast<uint64_t>(std::min<int64_t>(std::max<int64_t>(chunk, 0), tokens)) * n *
                          static_cast<uint64_t>(c.num_attention_heads) * 4;
  return kv + scores;
}

uint64_t memory_limit_bytes() {
  uint64_t limit = std::numeric_limits<uint64_t>::max();
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  for (const char* f : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t v = read_limit(f);
    if (v > 0) limit = std::min(limit, v);
  }
  for (int res : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit rl {};
    if (::getrlimit(res, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = std::min<uint64_t>(limit, rl.rlim_cur);
  }
  return limit;
}

void check_fits_in_memory(uint64_t bytes, const std::string& what, const std::string& why) {
  const uint64_t limit = memory_limit_bytes();
  if (bytes > limit)
    throw Error(str_cat(what, " needs ", gib(bytes), ", more than the ", gib(limit), " of memory this process may use (",
                        why, ")"));
}

std::vector<std::pair<std::string, size_t>> check_llm_checkpoint(const LlmConfig& cfg,
                                                                  const std::vector<SafeTensors>& files,
                                                                  const std::map<std::string, std::string>& weight_map,
                                                                  const std::string& folder,
                                                                  const std::string& index_file,
                                                                  const std::string& config_path) {
  // Every tensor of the checkpoint -> the file that holds it.
  std::map<std::string, size_t> where;
  for (size_t f = 0; f < files.size(); ++f)
    for (const auto& name : files[f].names()) {
      auto [it, fresh] = where.emplace(name, f);
      if (!fresh)
        throw Error(str_cat("tensor '", name, "' is stored twice: in ", files[it->second].path(), " and in ",
                            files[f].path()));
    }
  for (const auto& [name, shard] : weight_map) {
    auto it = where.find(name);
    if (it == where.end() || files[it->second].path() != shard)
      throw Error(str_cat(index_file, ": weight_map puts tensor '", name, "' in ", shard,
                          it == where.end() ? ", which does not hold it" : str_cat(", but it is in ", files[it->second].path())));
  }
  auto files_list = [&] {
    std::string s;
    for (const auto& f : files) s += (s.empty() ? "" : ", ") + f.path();
    return s;
  };
  const std::vector<Param> params = params_of(cfg);
  std::vector<std::pair<std::string, size_t>> out;
  std::set<std::string> expected;
  for (const Param& p : params) {
    expected.insert(p.name);
    auto it = where.find(p.name);
    if (it == where.end())
      throw Error(str_cat(folder, ": missing tensor '", p.name, "' (expected shape ", shape_text(p.shape), ") in ",
                          files_list(), "; ", config_path, " declares num_hidden_layers ", cfg.num_hidden_layers,
                          cfg.tie_word_embeddings ? ", tied embeddings" : ""));
    const SafeTensors& st = files[it->second];
    const auto& e = st.entry(p.name);
    if (e.shape != p.shape)
      throw Error(str_cat(st.path(), ": tensor '", p.name, "' has shape ", shape_text(e.shape), ", expected ",
                          shape_text(p.shape), " (", config_path, ": ", p.fields, ")"));
    if (e.dtype != at::kFloat && e.dtype != at::kHalf && e.dtype != at::kBFloat16)
      throw Error(str_cat(st.path(), ": tensor '", p.name, "' is stored as ", c10::toString(e.dtype),
                          "; the loader reads F32, F16 and BF16"));
    out.emplace_back(p.name, it->second);
  }
  for (const auto& [name, f] : where) {
    if (expected.count(name)) continue;
    const auto& e = files[f].entry(name);
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;
    if (cfg.tie_word_embeddings && name == "lm_head.weight") {
      const std::vector<int64_t> want = {cfg.vocab_size, cfg.hidden_size};
      if (e.shape != want)
        throw Error(str_cat(files[f].path(), ": tensor 'lm_head.weight' has shape ", shape_text(e.shape), ", expected ",
                            shape_text(want), " (", config_path, ": vocab_size ", cfg.vocab_size, ", hidden_size ",
                            cfg.hidden_size, ")"));
      continue;
    }
    throw Error(str_cat(files[f].path(), ": unexpected tensor '", name, "' (shape ", shape_text(e.shape), ") not in a ",
                        cfg.model_type, " model of ", cfg.num_hidden_layers, " layers (", config_path, ")"));
  }
  return out;
}

}  // namespace wm::llm
