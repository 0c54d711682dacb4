#include "dit/mg2_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"
#include "runtime/json_file.h"

namespace wm::dit {
namespace {

using nlohmann::json;

template <class T>
void read(const json& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    throw Error(str_cat(where, ": ", key, ": expected ", std::is_same_v<T, bool> ? "a boolean"
                        : std::is_arithmetic_v<T>                             ? "a number"
                                                                              : "a value of another type",
                        ", got ", it->dump()));
  }
}

void read_ints(const json& j, const char* key, std::vector<int>& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_array()) throw Error(str_cat(where, ": ", key, ": expected a list of integers, got ", it->dump()));
  out.clear();
  for (const auto& v : *it) {
    if (!v.is_number_integer()) throw Error(str_cat(where, ": ", key, ": expected integers, got ", it->dump()));
    out.push_back(v.get<int>());
  }
}

}  // namespace

bool Mg2ActionConfig::has_block(int l) const { return std::find(blocks.begin(), blocks.end(), l) != blocks.end(); }

std::string Mg2Config::mode() const {
  if (!action) return "custom";
  if (action->enable_keyboard && action->enable_mouse && action->keyboard_dim_in == 4) return "universal";
  if (action->enable_keyboard && action->enable_mouse && action->keyboard_dim_in == 2) return "gta_drive";
  if (action->enable_keyboard && !action->enable_mouse && action->keyboard_dim_in == 7) return "templerun";
  return "custom";
}

void Mg2Config::validate() const {
  auto fail = [](const std::string& field, const std::string& what) { throw Error(str_cat(field, ": ", what)); };
  if (model_type != "i2v") fail("model_type", str_cat("only 'i2v' exists upstream, got '", model_type, "'"));
  if (dim <= 0 || num_heads <= 0 || dim % num_heads != 0)
    fail("dim", str_cat(dim, " must be a positive multiple of num_heads ", num_heads));
  if (head_dim() % 2 != 0 || head_dim() < 6) fail("num_heads", str_cat("head dim ", head_dim(), " must be even and >= 6"));
  if (ffn_dim <= 0) fail("ffn_dim", str_cat("must be > 0, got ", ffn_dim));
  if (freq_dim <= 0 || freq_dim % 2 != 0) fail("freq_dim", str_cat("must be even and > 0, got ", freq_dim));
  if (num_layers <= 0) fail("num_layers", str_cat("must be > 0, got ", num_layers));
  if (out_dim <= 0 || in_dim <= out_dim)
    fail("in_dim", str_cat(in_dim, " must exceed out_dim ", out_dim, " (noise | mask | image latent)"));
  if (local_attn_size < frames_per_chunk)
    fail("local_attn_size", str_cat("must be >= ", frames_per_chunk, " (it counts the current chunk), got ",
                                    local_attn_size, " (-1, global attention, is not supported at inference)"));
  if (sink_size != 0) fail("sink_size", str_cat("only 0 is supported (as every release), got ", sink_size));
  if (!(eps > 0)) fail("eps", "must be > 0");
  if (action) {
    const auto& a = *action;
    if (!a.enable_keyboard && !a.enable_mouse) fail("action_config", "enables neither keyboard nor mouse");
    for (int b : a.blocks)
      if (b < 0 || b >= num_layers)
        fail("action_config.blocks", str_cat("block ", b, " is outside 0..", num_layers - 1));
    if (a.img_hidden_size != dim)
      fail("action_config.img_hidden_size", str_cat(a.img_hidden_size, " must equal dim ", dim));
    if (a.heads_num <= 0) fail("action_config.heads_num", "must be > 0");
    auto check_rope = [&](const char* name, const std::vector<int>& list, int head) {
      int s = 0;
      for (int v : list) s += v;
      if (list.size() != 3 || s != head || list[0] % 2 != 0)
        fail(str_cat("action_config.", name), str_cat("must be 3 even sizes summing to the head dim ", head));
    };
    if (a.enable_keyboard) {
      if (a.keyboard_dim_in <= 0) fail("action_config.keyboard_dim_in", "must be > 0");
      if (a.keyboard_hidden_dim % a.heads_num != 0)
        fail("action_config.keyboard_hidden_dim", str_cat("must be a multiple of heads_num ", a.heads_num));
      check_rope("rope_dim_list", a.rope_dim_list, a.keyboard_head_dim());
    }
    if (a.enable_mouse) {
      if (a.mouse_dim_in <= 0) fail("action_config.mouse_dim_in", "must be > 0");
      if (a.mouse_hidden_dim % a.heads_num != 0)
        fail("action_config.mouse_hidden_dim", str_cat("must be a multiple of heads_num ", a.heads_num));
      check_rope("mouse_qk_dim_list", a.mouse_qk_dim_list, a.mouse_head_dim());
    }
    if (a.vae_time_compression_ratio <= 0 || a.windows_size <= 0)
      fail("action_config.windows_size", "windows_size and vae_time_compression_ratio must be > 0");
  }
}

Mg2Config mg2_config_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(str_cat(where, ": expected a JSON object"));
  Mg2Config c;
  read(j, "model_type", c.model_type, where);
  read(j, "dim", c.dim, where);
  read(j, "ffn_dim", c.ffn_dim, where);
  read(j, "freq_dim", c.freq_dim, where);
  read(j, "num_heads", c.num_heads, where);
  read(j, "num_layers", c.num_layers, where);
  read(j, "in_dim", c.in_dim, where);
  read(j, "out_dim", c.out_dim, where);
  read(j, "eps", c.eps, where);
  read(j, "local_attn_size", c.local_attn_size, where);
  read(j, "sink_size", c.sink_size, where);
  std::vector<int> patch;
  read_ints(j, "patch_size", patch, where);
  if (!patch.empty() && patch != std::vector<int>{1, 2, 2})
    throw Error(str_cat(where, ": patch_size: only [1, 2, 2] exists upstream, got ", j["patch_size"].dump()));
  for (const char* k : {"qk_norm", "cross_attn_norm"}) {
    bool v = true;
    read(j, k, v, where);
    if (!v) throw Error(str_cat(where, ": ", k, ": false is not supported (every release uses true)"));
  }
  auto it = j.find("action_config");
  if (it != j.end() && !it->is_null() && !(it->is_object() && it->empty())) {
    if (!it->is_object()) throw Error(str_cat(where, ": action_config: expected an object"));
    const json& a = *it;
    const std::string w = where + ": action_config";
    Mg2ActionConfig ac;
    read_ints(a, "blocks", ac.blocks, w);
    read(a, "enable_keyboard", ac.enable_keyboard, w);
    read(a, "enable_mouse", ac.enable_mouse, w);
    read(a, "heads_num", ac.heads_num, w);
    read(a, "hidden_size", ac.hidden_size, w);
    read(a, "img_hidden_size", ac.img_hidden_size, w);
    read(a, "keyboard_dim_in", ac.keyboard_dim_in, w);
    read(a, "keyboard_hidden_dim", ac.keyboard_hidden_dim, w);
    read(a, "mouse_dim_in", ac.mouse_dim_in, w);
    read(a, "mouse_hidden_dim", ac.mouse_hidden_dim, w);
    read_ints(a, "rope_dim_list", ac.rope_dim_list, w);
    read_ints(a, "mouse_qk_dim_list", ac.mouse_qk_dim_list, w);
    read(a, "rope_theta", ac.rope_theta, w);
    read(a, "vae_time_compression_ratio", ac.vae_time_compression_ratio, w);
    read(a, "windows_size", ac.windows_size, w);
    read(a, "qk_norm", ac.qk_norm, w);
    read(a, "qkv_bias", ac.qkv_bias, w);
    std::vector<int> ap;
    read_ints(a, "patch_size", ap, w);
    if (!ap.empty() && ap != std::vector<int>{1, 2, 2})
      throw Error(str_cat(w, ": patch_size: only [1, 2, 2] is supported, got ", a["patch_size"].dump()));
    c.action = ac;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(str_cat(where, ": ", e.what()));
  }
  return c;
}

Mg2Config load_mg2_config(const std::string& path) {
  return mg2_config_from_json(read_json_file(path), path);
}

json mg2_config_to_json(const Mg2Config& c) {
  json j = {{"_class_name", "CausalWanModel"}, {"model_type", c.model_type}, {"dim", c.dim},
            {"ffn_dim", c.ffn_dim},              {"freq_dim", c.freq_dim},     {"num_heads", c.num_heads},
            {"num_layers", c.num_layers},        {"in_dim", c.in_dim},         {"out_dim", c.out_dim},
            {"eps", c.eps},                      {"local_attn_size", c.local_attn_size},
            {"sink_size", c.sink_size}};
  if (c.action) {
    const auto& a = *c.action;
    j["action_config"] = {{"blocks", a.blocks},
                          {"enable_keyboard", a.enable_keyboard},
                          {"enable_mouse", a.enable_mouse},
                          {"heads_num", a.heads_num},
                          {"hidden_size", a.hidden_size},
                          {"img_hidden_size", a.img_hidden_size},
                          {"keyboard_dim_in", a.keyboard_dim_in},
                          {"keyboard_hidden_dim", a.keyboard_hidden_dim},
                          {"mouse_dim_in", a.mouse_dim_in},
                          {"mouse_hidden_dim", a.mouse_hidden_dim},
                          {"rope_dim_list", a.rope_dim_list},
                          {"mouse_qk_dim_list", a.mouse_qk_dim_list},
                          {"patch_size", {1, 2, 2}},
                          {"qk_norm", a.qk_norm},
                          {"qkv_bias", a.qkv_bias},
                          {"rope_theta", a.rope_theta},
                          {"vae_time_compression_ratio", a.vae_time_compression_ratio},
                          {"windows_size", a.windows_size}};
  }
  return j;
}

}  // namespace wm::dit
