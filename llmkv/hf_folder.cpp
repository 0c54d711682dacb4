#include "llmkv/hf_folder.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "llmkv/json_file.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfig = "config.json";
constexpr const char* kGeneration = "generation_config.json";
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kTokenizer = "tokenizer.json";

std::string join(const std::string& folder, const std::string& name) { return (fs::path(folder) / name).string(); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Tensors a checkpoint may hold that the model does not need (see hf_folder.h).
bool harmless_extra(const std::string& name, const LlmConfig& c) {
  return ends_with(name, ".rotary_emb.inv_freq") || (c.tie_word_embeddings && name == "lm_head.weight");
}

// A shard name from the index: a plain file name inside the folder.
void check_shard_name(const std::string& shard, const std::string& index) {
  const fs::path p(shard);
  if (shard.empty() || p.is_absolute() || p.has_parent_path() || shard == "." || shard == "..")
    throw Error(str_cat(index, ": weight_map names '", shard, "', not a file name inside the folder"));
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(str_cat("save_llm: cannot write '", tmp, "'"));
    f << text;
    f.flush();
    if (!f) {
      f.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(str_cat("save_llm: write to '", tmp, "' failed"));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(str_cat("save_llm: cannot rename '", tmp, "' to '", path, "'"));
  }
}

const char* dtype_config_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: throw Error(str_cat("save_llm: parameters of dtype ", c10::toString(t), " (float32, float16 or bfloat16)"));
  }
}

}  // namespace

HfFolder HfFolder::open(const std::string& folder) {
  HfFolder h;
  h.path = folder;
  if (!fs::is_directory(folder)) throw Error(str_cat(folder, ": not a folder"));
  const std::string cfg = join(folder, kConfig);
  if (!fs::exists(cfg)) throw Error(str_cat(folder, ": no ", kConfig));
  h.config = LlmConfig::load(cfg);
  h.generation = GenerationDefaults::load(join(folder, kGeneration));
  if (fs::exists(join(folder, kTokenizer))) h.tokenizer_file = join(folder, kTokenizer);

  if (fs::exists(join(folder, kSingle))) {
    h.weight_files = {join(folder, kSingle)};
    return h;
  }
  const std::string index = join(folder, kIndex);
  if (!fs::exists(index)) {
    const bool bin = fs::exists(join(folder, "pytorch_model.bin")) || fs::exists(join(folder, "pytorch_model.bin.index.json"));
    throw Error(str_cat(folder, ": no ", kSingle, " or ", kIndex,
                        bin ? " (pytorch_model.bin checkpoints are not read; convert them to safetensors)" : ""));
  }
  h.index_file = index;
  const json j = read_json_file(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(str_cat(index, ": field 'weight_map': missing or not an object"));
  std::set<std::string> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw Error(str_cat(index, ": weight_map['", it.key(), "'] must be a file name, got ", it.value().dump()));
    const std::string shard = it.value().get<std::string>();
    check_shard_name(shard, index);
    h.weight_map[it.key()] = join(folder, shard);
    shards.insert(shard);
  }
  if (shards.empty()) throw Error(str_cat(index, ": weight_map is empty"));
  for (const auto& s : shards) {
    const std::string p = join(folder, s);
    if (!fs::is_regular_file(p)) throw Error(str_cat(index, ": shard '", s, "' named in weight_map does not exist (", p, ")"));
    h.weight_files.push_back(p);
  }
  return h;
}

void load_llm_weights(LlmModelImpl& model, const HfFolder& folder) {
  const LlmConfig& cfg = model.config();
  std::vector<SafeTensors> files;
  files.reserve(folder.weight_files.size());
  for (const auto& p : folder.weight_files) files.push_back(SafeTensors::open(p));  // CorruptData names the file

  // Every tensor of the checkpoint -> the file that holds it.
  std::map<std::string, size_t> where;
  for (size_t f = 0; f < files.size(); ++f)
    for (const auto& name : files[f].names()) {
      auto [it, fresh] = where.emplace(name, f);
      if (!fresh)
        throw Error(str_cat("tensor '", name, "' is stored twice: in ", files[it->second].path(), " and in ",
                            files[f].path()));
    }
  for (const auto& [name, shard] : folder.weight_map) {
    auto it = where.find(name);
    if (it == where.end() || files[it->second].path() != shard)
      throw Error(str_cat(folder.index_file, ": weight_map puts tensor '", name, "' in ", shard,
                          it == where.end() ? ", which does not hold it" : str_cat(", but it is in ", files[it->second].path())));
  }
  auto files_list = [&] {
    std::string s;
    for (const auto& f : files) s += (s.empty() ? "" : ", ") + f.path();
    return s;
  };
  auto check_dtype = [&](const std::string& name, const SafeTensors& st) {
    const auto t = st.entry(name).dtype;
    if (t != at::kFloat && t != at::kHalf && t != at::kBFloat16)
      throw Error(str_cat(st.path(), ": tensor '", name, "' is stored as ", c10::toString(t),
                          "; the loader reads F32, F16 and BF16"));
  };

  auto params = model.named_parameters(true);
  std::set<std::string> expected;
  for (const auto& p : params) {
    expected.insert(p.key());
    auto it = where.find(p.key());
    if (it == where.end())
      throw Error(str_cat(folder.path, ": missing tensor '", p.key(), "' (expected shape ", p.value().sizes(),
                          ") in ", files_list()));
    const SafeTensors& st = files[it->second];
    const auto& e = st.entry(p.key());
    if (at::IntArrayRef(e.shape) != p.value().sizes())
      throw Error(str_cat(st.path(), ": tensor '", p.key(), "' has shape ", at::IntArrayRef(e.shape), ", expected ",
                          p.value().sizes()));
    check_dtype(p.key(), st);
  }
  for (const auto& [name, f] : where) {
    if (expected.count(name)) continue;
    const auto& e = files[f].entry(name);
    if (harmless_extra(name, cfg)) {
      if (name == "lm_head.weight") {
        const std::vector<int64_t> want = {cfg.vocab_size, cfg.hidden_size};
        if (e.shape != want)
          throw Error(str_cat(files[f].path(), ": tensor 'lm_head.weight' has shape ", at::IntArrayRef(e.shape),
                              ", expected ", at::IntArrayRef(want)));
      }
      continue;
    }
    throw Error(str_cat(files[f].path(), ": unexpected tensor '", name, "' (shape ", at::IntArrayRef(e.shape),
                        ") not in a ", cfg.model_type, " model of ", cfg.num_hidden_layers, " layers"));
  }

  at::NoGradGuard no_grad;
  for (auto& p : params) {
    const SafeTensors& st = files[where.at(p.key())];
    at::Tensor t = st.get(p.key());
    // Checked once at load (cheap next to reading): NaN or inf weights would only show up as
    // garbage text much later.
    if (!at::isfinite(t).all().item<bool>())
      throw Error(str_cat(st.path(), ": tensor '", p.key(), "' holds ", (~at::isfinite(t)).sum().item<int64_t>(),
                          " non-finite values (NaN or inf)"));
    p.value().copy_(t);  // converts the dtype, moves to the parameter's device
  }
}

LlmModel load_llm(const HfFolder& folder, at::Device device, at::ScalarType dtype) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
           "dtype must be float32, float16 or bfloat16, got ", c10::toString(dtype));
  LlmModel m(folder.config);
  m->to(dtype);
  load_llm_weights(*m, folder);
  m->to(device);
  m->eval();
  return m;
}

LlmModel load_llm(const std::string& folder, at::Device device, at::ScalarType dtype) {
  return load_llm(HfFolder::open(folder), device, dtype);
}

void save_llm(const std::string& folder, LlmModelImpl& model) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec || !fs::is_directory(folder)) throw Error(str_cat("save_llm: cannot create folder '", folder, "'"));
  LlmConfig cfg = model.config();
  cfg.torch_dtype = dtype_config_name(model.dtype());

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : model.named_parameters(true)) tensors.emplace_back(p.key(), p.value().detach());
  save_safetensors(join(folder, kSingle), tensors, {{"format", "pt"}});
  write_text_atomically(join(folder, kConfig), cfg.to_json().dump(2) + "\n");

  // An index from an earlier sharded save would describe other weights: remove it and its shards.
  const std::string index = join(folder, kIndex);
  if (fs::exists(index)) {
    std::set<std::string> shards;
    try {
      std::ifstream f(index);
      json j = json::parse(f);
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
        const std::string s = it.value().get<std::string>();
        check_shard_name(s, index);
        if (s != kSingle) shards.insert(s);
      }
    } catch (const std::exception&) {
      shards.clear();  // an unreadable index: remove it alone
    }
    fs::remove(index, ec);
    if (ec) throw Error(str_cat("save_llm: cannot remove the stale index '", index, "'"));
    for (const auto& s : shards) fs::remove(join(folder, s), ec);
  }
}

}  // namespace wm::llm
