#include "llmkv/config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "llmkv/json_file.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

using nlohmann::json;

constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxHidden = int64_t(1) << 16;
constexpr int64_t kMaxIntermediate = int64_t(1) << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxPositions = int64_t(1) << 30;

[[noreturn]] void field_error(const std::string& where, const std::string& field, const std::string& msg) {
  throw Error(str_cat(where, ": field '", field, "': ", msg));
}

// Reads fields of one JSON object with errors "<where>: field '<name>': ...". Absent and null
// read as "not given".
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw Error(str_cat(where_, ": expected a JSON object, got ", j_.type_name()));
  }
  const std::string& where() const { return where_; }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const { return j_.at(key); }

  // An integer in [lo, hi]: a JSON integer (not a float, not a string), compared as a whole
  // number before any narrowing.
  bool integer(const char* key, int64_t& out, int64_t lo, int64_t hi, bool required = false) const {
    if (!has(key)) {
      if (required) field_error(where_, key, "missing (required)");
      return false;
    }
    out = checked_integer(j_.at(key), key, lo, hi);
    return true;
  }
  int64_t checked_integer(const json& v, const std::string& key, int64_t lo, int64_t hi) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(hi))
        field_error(where_, key, str_cat("must be an integer in [", lo, ", ", hi, "], got ", u));
      const auto s = static_cast<int64_t>(u);
      if (s < lo) field_error(where_, key, str_cat("must be an integer in [", lo, ", ", hi, "], got ", s));
      return s;
    }
    if (v.is_number_integer()) {
      const int64_t s = v.get<int64_t>();
      if (s < lo || s > hi) field_error(where_, key, str_cat("must be an integer in [", lo, ", ", hi, "], got ", s));
      return s;
    }
    field_error(where_, key, str_cat("must be an integer, got ", v.dump()));
  }
  bool real(const char* key, double& out) const {
    if (!has(key)) return false;
    const json& v = j_.at(key);
    if (!v.is_number()) field_error(where_, key, str_cat("must be a number, got ", v.dump()));
    out = v.get<double>();
    if (!std::isfinite(out)) field_error(where_, key, str_cat("must be finite, got ", v.dump()));
    return true;
  }
  bool boolean(const char* key, bool& out) const {
    if (!has(key)) return false;
    const json& v = j_.at(key);
    if (!v.is_boolean()) field_error(where_, key, str_cat("must be true or false, got ", v.dump()));
    out = v.get<bool>();
    return true;
  }
  bool string(const char* key, std::string& out) const {
    if (!has(key)) return false;
    const json& v = j_.at(key);
    if (!v.is_string()) field_error(where_, key, str_cat("must be a string, got ", v.dump()));
    out = v.get<std::string>();
    return true;
  }
  // null, an integer or a list of integers, each in [lo, hi].
  std::vector<int64_t> id_list(const char* key, int64_t lo, int64_t hi) const {
    std::vector<int64_t> ids;
    if (!has(key)) return ids;
    const json& v = j_.at(key);
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) ids.push_back(checked_integer(v[i], str_cat(key, "[", i, "]"), lo, hi));
    } else {
      ids.push_back(checked_integer(v, key, lo, hi));
    }
    return ids;
  }

 private:
  const json& j_;
  std::string where_;
};

json id_json(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}


}  // namespace

void LlmConfig::validate() const {
  const std::string w = str_cat("LlmConfig (", model_type, ")");
  auto range = [&](const char* f, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) field_error(w, f, str_cat("must be in [", lo, ", ", hi, "], got ", v));
  };
  if (model_type != "llama" && model_type != "qwen2")
    field_error(w, "model_type", str_cat("must be \"llama\" or \"qwen2\", got \"", model_type, "\""));
  range("vocab_size", vocab_size, 1, kMaxVocab);
  range("hidden_size", hidden_size, 1, kMaxHidden);
  range("intermediate_size", intermediate_size, 1, kMaxIntermediate);
  range("num_hidden_layers", num_hidden_layers, 1, kMaxLayers);
  range("num_attention_heads", num_attention_heads, 1, kMaxHeads);
  range("num_key_value_heads", num_key_value_heads, 1, num_attention_heads);
  if (num_attention_heads % num_key_value_heads != 0)
    field_error(w, "num_key_value_heads",
                str_cat(num_key_value_heads, " does not divide num_attention_heads ", num_attention_heads));
  range("head_dim", head_dim, 2, kMaxHeadDim);
  if (head_dim % 2 != 0) field_error(w, "head_dim", str_cat("must be even (RoPE pairs), got ", head_dim));
  range("max_position_embeddings", max_position_embeddings, 1, kMaxPositions);
  if (!(rms_norm_eps > 0 && rms_norm_eps < 1)) field_error(w, "rms_norm_eps", str_cat("must be in (0, 1), got ", rms_norm_eps));
  if (!(rope_theta > 0 && std::isfinite(rope_theta)))
    field_error(w, "rope_theta", str_cat("must be a positive number, got ", rope_theta));
  if (!(initializer_range >= 0 && std::isfinite(initializer_range)))
    field_error(w, "initializer_range", str_cat("must be >= 0, got ", initializer_range));
  if (torch_dtype != "float32" && torch_dtype != "float16" && torch_dtype != "bfloat16")
    field_error(w, "torch_dtype", str_cat("must be float32, float16 or bfloat16, got \"", torch_dtype, "\""));
  if (mlp_bias && model_type != "llama") field_error(w, "mlp_bias", "only Llama has MLP biases");
  for (auto* ids : {&bos_token_ids, &eos_token_ids})
    for (int64_t id : *ids)
      if (id < 0 || id >= vocab_size)
        field_error(w, ids == &bos_token_ids ? "bos_token_id" : "eos_token_id",
                    str_cat("token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
}

LlmConfig LlmConfig::from_json(const json& j, const std::string& where) {
  Reader r(j, where);
  LlmConfig c;
  if (!r.string("model_type", c.model_type)) field_error(where, "model_type", "missing (required)");
  if (c.model_type != "llama" && c.model_type != "qwen2")
    field_error(where, "model_type", str_cat("\"", c.model_type, "\" is not supported (llama or qwen2)"));

  r.integer("vocab_size", c.vocab_size, 1, kMaxVocab, true);
  r.integer("hidden_size", c.hidden_size, 1, kMaxHidden, true);
  r.integer("intermediate_size", c.intermediate_size, 1, kMaxIntermediate, true);
  r.integer("num_hidden_layers", c.num_hidden_layers, 1, kMaxLayers, true);
  r.integer("num_attention_heads", c.num_attention_heads, 1, kMaxHeads, true);
  c.num_key_value_heads = c.num_attention_heads;
  r.integer("num_key_value_heads", c.num_key_value_heads, 1, c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    field_error(where, "num_key_value_heads",
                str_cat(c.num_key_value_heads, " does not divide num_attention_heads ", c.num_attention_heads));
  if (!r.integer("head_dim", c.head_dim, 2, kMaxHeadDim)) {
    if (c.hidden_size % c.num_attention_heads != 0)
      field_error(where, "num_attention_heads",
                  str_cat(c.num_attention_heads, " does not divide hidden_size ", c.hidden_size,
                          " (and no head_dim is given)"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) field_error(where, "head_dim", str_cat("must be even (RoPE pairs), got ", c.head_dim));
  r.integer("max_position_embeddings", c.max_position_embeddings, 1, kMaxPositions);
  r.real("rms_norm_eps", c.rms_norm_eps);
  r.real("initializer_range", c.initializer_range);
  r.boolean("tie_word_embeddings", c.tie_word_embeddings);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases (and none on o_proj)
  } else {
    r.boolean("attention_bias", c.attention_bias);
    r.boolean("mlp_bias", c.mlp_bias);
  }

  std::string act = "silu";
  r.string("hidden_act", act);
  if (act != "silu") field_error(where, "hidden_act", str_cat("only \"silu\" is supported, got \"", act, "\""));
  if (r.has("quantization_config")) field_error(where, "quantization_config", "quantized checkpoints are not supported");

  // RoPE: the older layout (rope_theta, rope_scaling) or rope_parameters (transformers 5).
  if (r.has("rope_scaling"))
    field_error(where, "rope_scaling",
                str_cat("RoPE scaling is not supported (only null), got ", r.at("rope_scaling").dump()));
  const bool top_theta = r.real("rope_theta", c.rope_theta);
  if (r.has("rope_parameters")) {
    Reader rp(r.at("rope_parameters"), where + ": rope_parameters");
    std::string type = "default";
    if (!rp.string("rope_type", type)) rp.string("type", type);
    if (type != "default")
      field_error(where, "rope_parameters.rope_type",
                  str_cat("only \"default\" RoPE is supported, got \"", type, "\""));
    double theta = c.rope_theta;
    if (rp.real("rope_theta", theta)) {
      if (top_theta && theta != c.rope_theta)
        field_error(where, "rope_parameters.rope_theta",
                    str_cat(theta, " differs from the top-level rope_theta ", c.rope_theta));
      c.rope_theta = theta;
    }
    double partial = 1.0;
    if (rp.real("partial_rotary_factor", partial) && partial != 1.0)
      field_error(where, "rope_parameters.partial_rotary_factor", str_cat("must be 1, got ", partial));
  }
  double partial = 1.0;
  if (r.real("partial_rotary_factor", partial) && partial != 1.0)
    field_error(where, "partial_rotary_factor", str_cat("must be 1, got ", partial));

  // Sliding-window attention (Qwen2's use_sliding_window, per-layer layer_types).
  bool sliding = false;
  if (r.boolean("use_sliding_window", sliding) && sliding)
    field_error(where, "use_sliding_window", "sliding-window attention is not supported (must be false)");
  if (r.has("layer_types")) {
    const json& lt = r.at("layer_types");
    if (!lt.is_array()) field_error(where, "layer_types", str_cat("must be a list, got ", lt.dump()));
    if (static_cast<int64_t>(lt.size()) != c.num_hidden_layers)
      field_error(where, "layer_types",
                  str_cat("has ", lt.size(), " entries for num_hidden_layers ", c.num_hidden_layers));
    for (size_t i = 0; i < lt.size(); ++i)
      if (!lt[i].is_string() || lt[i].get<std::string>() != "full_attention")
        field_error(where, str_cat("layer_types[", i, "]"),
                    str_cat("only \"full_attention\" is supported, got ", lt[i].dump()));
  }

  if (!r.string("torch_dtype", c.torch_dtype)) r.string("dtype", c.torch_dtype);
  c.bos_token_ids = r.id_list("bos_token_id", 0, c.vocab_size - 1);
  c.eos_token_ids = r.id_list("eos_token_id", 0, c.vocab_size - 1);

  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(str_cat(where, ": ", e.what()));
  }
  return c;
}

LlmConfig LlmConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

json LlmConfig::to_json() const {
  json j;
  j["architectures"] = json::array({model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = max_position_embeddings;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (model_type == "llama") {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = mlp_bias;
  } else {
    j["use_sliding_window"] = false;
  }
  j["initializer_range"] = initializer_range;
  j["torch_dtype"] = torch_dtype;
  j["bos_token_id"] = id_json(bos_token_ids);
  j["eos_token_id"] = id_json(eos_token_ids);
  return j;
}

GenerationDefaults GenerationDefaults::load(const std::string& path) {
  GenerationDefaults g;
  if (!std::filesystem::exists(path)) return g;
  const json j = read_json_file(path);
  Reader r(j, path);
  g.present = true;
  g.eos_token_ids = r.id_list("eos_token_id", 0, std::numeric_limits<int32_t>::max());
  r.real("temperature", g.temperature);
  if (g.temperature < 0) field_error(path, "temperature", str_cat("must be >= 0, got ", g.temperature));
  r.real("top_p", g.top_p);
  if (!(g.top_p > 0 && g.top_p <= 1)) field_error(path, "top_p", str_cat("must be in (0, 1], got ", g.top_p));
  r.integer("top_k", g.top_k, 0, kMaxVocab);
  r.boolean("do_sample", g.do_sample);
  return g;
}

}  // namespace wm::llm
