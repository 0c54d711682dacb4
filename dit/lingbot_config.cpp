#include "dit/lingbot_config.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/error.h"
#include "runtime/json_file.h"

namespace wm::dit {
namespace {

using nlohmann::json;

template <class T>
void lingbot_read(const json& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  const bool ok = std::is_same_v<T, bool>          ? it->is_boolean()
                  : std::is_same_v<T, std::string> ? it->is_string()
                  : std::is_integral_v<T>          ? it->is_number_integer()
                                                   : it->is_number();
  if (!ok)
    throw Error(str_cat(where, ": ", key, ": expected ",
                        std::is_same_v<T, bool>          ? "a boolean"
                        : std::is_same_v<T, std::string> ? "a string"
                        : std::is_integral_v<T>          ? "an integer"
                                                         : "a number",
                        ", got ", it->dump()));
  out = it->get<T>();
}

}  // namespace

void LingbotConfig::validate() const {
  auto fail = [](const std::string& field, const std::string& what) { throw Error(str_cat(field, ": ", what)); };
  if (model_type != "i2v" && model_type != "t2v")
    fail("model_type", str_cat("must be 'i2v' or 't2v' (as upstream), got '", model_type, "'"));
  if (control_type != "cam" && control_type != "act")
    fail("control_type", str_cat("must be 'cam' or 'act', got '", control_type, "'"));
  if (dim <= 0 || num_heads <= 0 || dim % num_heads != 0)
    fail("dim", str_cat(dim, " must be a positive multiple of num_heads ", num_heads));
  if (head_dim() % 2 != 0 || head_dim() < 6)
    fail("num_heads", str_cat("head dim ", head_dim(), " must be even and >= 6"));
  if (ffn_dim <= 0) fail("ffn_dim", str_cat("must be > 0, got ", ffn_dim));
  if (freq_dim <= 0 || freq_dim % 2 != 0) fail("freq_dim", str_cat("must be even and > 0, got ", freq_dim));
  if (num_layers <= 0) fail("num_layers", str_cat("must be > 0, got ", num_layers));
  if (text_len <= 0) fail("text_len", str_cat("must be > 0, got ", text_len));
  if (text_dim <= 0) fail("text_dim", str_cat("must be > 0, got ", text_dim));
  if (out_dim <= 0) fail("out_dim", str_cat("must be > 0, got ", out_dim));
  if (model_type == "i2v" && in_dim <= out_dim)
    fail("in_dim", str_cat(in_dim, " must exceed out_dim ", out_dim, " for i2v (noise | mask | image latent)"));
  if (model_type == "t2v" && in_dim != out_dim)
    fail("in_dim", str_cat(in_dim, " must equal out_dim ", out_dim, " for t2v"));
  if (local_attn_size != -1 && local_attn_size < frames_per_chunk + sink_size)
    fail("local_attn_size", str_cat("must be -1 (all) or >= sink_size + ", frames_per_chunk, ", got ",
                                    local_attn_size, " with sink_size ", sink_size));
  if (sink_size < 0) fail("sink_size", str_cat("must be >= 0, got ", sink_size));
  if (!(eps > 0)) fail("eps", "must be > 0");
}

LingbotConfig lingbot_config_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(str_cat(where, ": expected a JSON object"));
  LingbotConfig c;
  lingbot_read(j, "model_type", c.model_type, where);
  lingbot_read(j, "control_type", c.control_type, where);
  lingbot_read(j, "text_len", c.text_len, where);
  lingbot_read(j, "in_dim", c.in_dim, where);
  lingbot_read(j, "dim", c.dim, where);
  lingbot_read(j, "ffn_dim", c.ffn_dim, where);
  lingbot_read(j, "freq_dim", c.freq_dim, where);
  lingbot_read(j, "text_dim", c.text_dim, where);
  lingbot_read(j, "out_dim", c.out_dim, where);
  lingbot_read(j, "num_heads", c.num_heads, where);
  lingbot_read(j, "num_layers", c.num_layers, where);
  lingbot_read(j, "local_attn_size", c.local_attn_size, where);
  lingbot_read(j, "sink_size", c.sink_size, where);
  lingbot_read(j, "eps", c.eps, where);
  auto patch = j.find("patch_size");
  if (patch != j.end() && !patch->is_null() && *patch != json::array({1, 2, 2}))
    throw Error(str_cat(where, ": patch_size: only [1, 2, 2] exists upstream, got ", patch->dump()));
  for (const char* k : {"qk_norm", "cross_attn_norm"}) {
    bool v = true;
    lingbot_read(j, k, v, where);
    if (!v) throw Error(str_cat(where, ": ", k, ": false is not supported (the release uses true)"));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(str_cat(where, ": ", e.what()));
  }
  return c;
}

LingbotConfig load_lingbot_config(const std::string& path) {
  return lingbot_config_from_json(read_json_file(path), path);
}

json lingbot_config_to_json(const LingbotConfig& c) {
  return {{"_class_name", "WanModelFast"},  {"model_type", c.model_type},
          {"control_type", c.control_type}, {"text_len", c.text_len},
          {"in_dim", c.in_dim},             {"dim", c.dim},
          {"ffn_dim", c.ffn_dim},           {"freq_dim", c.freq_dim},
          {"text_dim", c.text_dim},         {"out_dim", c.out_dim},
          {"num_heads", c.num_heads},       {"num_layers", c.num_layers},
          {"local_attn_size", c.local_attn_size}, {"sink_size", c.sink_size},
          {"eps", c.eps}};
}

}  // namespace wm::dit
