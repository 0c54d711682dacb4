#include "llmkv/hf_folder.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "llmkv/json_file.h"
#include "llmkv/weight_shapes.h"
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

// A file of the folder that is there under its name but cannot be read as one: a link to
// nothing, a folder. Absent names pass (the caller decides).
void check_plain_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  if (!fs::exists(link)) return;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_symlink(link) && !fs::exists(st))
    throw Error(str_cat(path, " is a link to ", fs::read_symlink(path, ec).string(), ", which does not exist"));
  if (fs::is_directory(st)) throw Error(str_cat(path, " is a folder, not a file"));
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
  if (folder.empty()) throw Error("the model folder's path is empty");
  std::error_code ec;
  if (!fs::exists(folder, ec)) throw Error(str_cat(folder, ": no such folder"));
  if (!fs::is_directory(folder, ec)) throw Error(str_cat(folder, ": not a folder (a model is a folder holding ", kConfig,
                                                         " and its weights)"));
  const std::string cfg = join(folder, kConfig);
  check_plain_file(cfg);
  if (!fs::exists(cfg)) throw Error(str_cat(folder, ": no ", kConfig));
  h.config = LlmConfig::load(cfg);
  check_plain_file(join(folder, kGeneration));
  h.generation = GenerationDefaults::load(join(folder, kGeneration));
  for (int64_t id : h.generation.eos_token_ids)
    if (id >= h.config.vocab_size)
      throw Error(str_cat(join(folder, kGeneration), ": field 'eos_token_id': token id ", id,
                          " is outside the vocabulary [0, ", h.config.vocab_size, ") of ", kConfig));
  if (fs::exists(join(folder, kTokenizer))) h.tokenizer_file = join(folder, kTokenizer);

  check_plain_file(join(folder, kSingle));
  if (fs::exists(join(folder, kSingle))) {
    h.weight_files = {join(folder, kSingle)};
    return h;
  }
  check_plain_file(join(folder, kIndex));
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
    check_index_file_name(shard, index);
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

namespace {

// The folder's weight files, opened (headers read, data mapped) and checked against `cfg`;
// per parameter the file that holds it.
struct CheckedWeights {
  std::vector<SafeTensors> files;
  std::vector<std::pair<std::string, size_t>> where;
};

CheckedWeights check_weights(const LlmConfig& cfg, const HfFolder& folder) {
  CheckedWeights w;
  w.files.reserve(folder.weight_files.size());
  for (const auto& p : folder.weight_files) w.files.push_back(SafeTensors::open(p));  // CorruptData names the file
  w.where = check_llm_checkpoint(cfg, w.files, folder.weight_map, folder.path, folder.index_file,
                                 join(folder.path, kConfig));
  return w;
}

// Copies the checked weights into the model's parameters, each checked for NaN and inf first.
void copy_weights(LlmModelImpl& model, const CheckedWeights& w) {
  auto params = model.named_parameters(true);
  WM_CHECK(params.size() == w.where.size(), "the model has ", params.size(), " parameters, the checkpoint check ",
           w.where.size());
  at::NoGradGuard no_grad;
  for (const auto& [name, f] : w.where) {
    at::Tensor* p = params.find(name);
    WM_CHECK(p != nullptr && p->sizes() == at::IntArrayRef(w.files[f].entry(name).shape), "parameter '", name,
             "' of the model does not match the checked checkpoint");
    const SafeTensors& st = w.files[f];
    at::Tensor t = st.get(name);
    // Checked once at load (cheap next to reading): NaN or inf weights would only show up as
    // garbage text much later.
    if (!at::isfinite(t).all().item<bool>())
      throw Error(str_cat(st.path(), ": tensor '", name, "' holds ", (~at::isfinite(t)).sum().item<int64_t>(),
                          " non-finite values (NaN or inf)"));
    p->copy_(t);  // converts the dtype, moves to the parameter's device
  }
}

}  // namespace

void load_llm_weights(LlmModelImpl& model, const HfFolder& folder) {
  copy_weights(model, check_weights(model.config(), folder));
}

LlmModel load_llm(const HfFolder& folder, at::Device device, at::ScalarType dtype) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
           "dtype must be float32, float16 or bfloat16, got ", c10::toString(dtype));
  // The headers first: a config that disagrees with its weights fails before any allocation.
  const CheckedWeights w = check_weights(folder.config, folder);
  const uint64_t bytes = static_cast<uint64_t>(llm_parameter_count(folder.config)) * c10::elementSize(dtype);
  check_fits_in_memory(bytes, str_cat("the model of ", folder.path),
                       str_cat(join(folder.path, kConfig), ": ", llm_size_fields(folder.config)));
  // Allocated at the weights' shapes (checked equal to the config's), never drawn at random.
  LlmModel m(folder.config, ParamAlloc{ParamInit::Uninitialised, dtype});
  copy_weights(*m, w);
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
  write_text_atomically(join(folder, kConfig), cfg.to_json().dump(2) + "\n", "save_llm");

  // An index from an earlier sharded save would describe other weights: remove it and its shards.
  const std::string index = join(folder, kIndex);
  if (fs::exists(index)) {
    std::set<std::string> shards;
    try {
      const json j = read_json_file(index);
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
        const std::string s = it.value().get<std::string>();
        check_index_file_name(s, index);
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
