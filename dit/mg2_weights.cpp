#include "dit/mg2_weights.h"

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "dit/weights.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::dit {
namespace fs = std::filesystem;

Mg2Files find_mg2_files(const std::string& path) {
  Mg2Files f;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> st;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") st.push_back(e.path().string());
    if (st.empty()) throw Error(str_cat(path, ": no .safetensors checkpoint in this folder"));
    if (st.size() > 1) {
      std::sort(st.begin(), st.end());
      std::string names;
      for (const auto& s : st) names += " " + fs::path(s).filename().string();
      throw Error(str_cat(path, ": more than one .safetensors checkpoint (", names.substr(1),
                          "); name the file instead of the folder"));
    }
    f.weights = st[0];
    f.config = (fs::path(path) / "config.json").string();
  } else if (fs::is_regular_file(path, ec)) {
    f.weights = path;
    f.config = (fs::path(path).parent_path() / "config.json").string();
  } else {
    throw Error(str_cat(path, ": no such file or folder"));
  }
  if (!fs::is_regular_file(f.config, ec))
    throw Error(str_cat(f.config, ": missing (the model's config.json ships beside its checkpoint)"));
  return f;
}

void check_mg2_config_against_weights(const Mg2Config& c, const std::string& config_path,
                                      const std::string& weights_path) {
  SafeTensors st = SafeTensors::open(weights_path);
  auto shape = [&](const std::string& key) -> std::vector<int64_t> {
    return st.contains("model." + key) ? st.entry("model." + key).shape : std::vector<int64_t>{};
  };
  auto refuse = [&](const std::string& field, const std::string& cfg_value, const std::string& file_value) {
    throw Error(str_cat(config_path, ": ", field, " is ", cfg_value, " but ", weights_path, " holds ", file_value));
  };
  const auto pe = shape("patch_embedding.weight");
  if (pe.size() == 5) {
    if (pe[0] != c.dim) refuse("dim", std::to_string(c.dim), str_cat("patch_embedding.weight of ", pe[0], " channels"));
    if (pe[1] != c.in_dim)
      refuse("in_dim", std::to_string(c.in_dim), str_cat("patch_embedding.weight of ", pe[1], " input channels"));
  }
  const auto hh = shape("head.head.weight");
  if (hh.size() == 2 && hh[0] != int64_t(c.out_dim) * c.patch_h * c.patch_w)
    refuse("out_dim", std::to_string(c.out_dim), str_cat("head.head.weight of ", hh[0], " = 4 x ", hh[0] / 4, " outputs"));
  const auto f0 = shape("blocks.0.ffn.0.weight");
  if (f0.size() == 2 && f0[0] != c.ffn_dim)
    refuse("ffn_dim", std::to_string(c.ffn_dim), str_cat("blocks.0.ffn.0.weight of ", f0[0], " rows"));
  // Blocks and action blocks present in the file.
  std::set<int> blocks, action_blocks;
  bool mouse = false;
  int64_t kd = -1;
  const std::regex re(R"(^model\.blocks\.(\d+)\.(.*)$)");
  for (const auto& name : st.names()) {
    std::smatch m;
    if (!std::regex_match(name, m, re)) continue;
    const int b = std::stoi(m[1]);
    blocks.insert(b);
    const std::string rest = m[2];
    if (rest.rfind("action_model.", 0) == 0) {
      action_blocks.insert(b);
      if (rest.rfind("action_model.mouse_mlp.", 0) == 0) mouse = true;
      if (rest == "action_model.keyboard_embed.0.weight") kd = st.entry(name).shape.at(1);
    }
  }
  if (!blocks.empty() && int(blocks.size()) != c.num_layers)
    refuse("num_layers", std::to_string(c.num_layers),
           str_cat(blocks.size(), " blocks (", *blocks.begin(), "..", *blocks.rbegin(), ")"));
  auto list = [](const std::set<int>& s) {
    std::string out = "[";
    for (int b : s) out += (out.size() > 1 ? ", " : "") + std::to_string(b);
    return out + "]";
  };
  std::set<int> cfg_blocks;
  if (c.action) cfg_blocks.insert(c.action->blocks.begin(), c.action->blocks.end());
  if (cfg_blocks != action_blocks)
    refuse("action_config.blocks", list(cfg_blocks), str_cat("action modules in blocks ", list(action_blocks)));
  if (c.action) {
    if (c.action->enable_mouse != mouse)
      refuse("action_config.enable_mouse", c.action->enable_mouse ? "true" : "false",
             mouse ? "mouse_mlp weights" : "no mouse_mlp weights");
    if (c.action->enable_keyboard && kd >= 0 && kd != c.action->keyboard_dim_in)
      refuse("action_config.keyboard_dim_in", std::to_string(c.action->keyboard_dim_in),
             str_cat("keyboard_embed.0.weight of ", kd, " inputs"));
  }
}

void load_mg2_weights(Mg2DitImpl& model, const std::string& weights_path) {
  SafeTensors st = SafeTensors::open(weights_path);
  LoadOptions opt;
  opt.strip_prefix = "model.";
  opt.strict = true;
  load_parameters(model, st, opt, str_cat("Matrix-Game-2.0 ", model.config().mode()));
}

Mg2Dit load_mg2_dit(const std::string& path, at::Device device, at::ScalarType dtype) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
           "dtype must be float32, bfloat16 or float16, got ", dtype);
  const Mg2Files f = find_mg2_files(path);
  Mg2Config cfg = load_mg2_config(f.config);
  check_mg2_config_against_weights(cfg, f.config, f.weights);
  Mg2Dit m(cfg);
  load_mg2_weights(*m, f.weights);
  m->to(device, dtype);
  m->eval();
  return m;
}

}  // namespace wm::dit
