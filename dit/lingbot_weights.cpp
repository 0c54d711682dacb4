#include "dit/lingbot_weights.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "runtime/error.h"
#include "runtime/json_file.h"
#include "runtime/safetensors.h"

namespace wm::dit {
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "diffusion_pytorch_model.safetensors.index.json";
constexpr const char* kSingleName = "diffusion_pytorch_model.safetensors";

// The weight_map of an index json, shard names resolved against its folder.
std::map<std::string, std::string> read_index(const fs::path& index) {
  const nlohmann::json j = read_json_file(index.string());
  auto it = j.find("weight_map");
  if (it == j.end() || !it->is_object() || it->empty())
    throw Error(str_cat(index.string(), ": no weight_map (key -> shard file) in the index"));
  std::map<std::string, std::string> keys;
  for (auto kv = it->begin(); kv != it->end(); ++kv) {
    if (!kv.value().is_string())
      throw Error(str_cat(index.string(), ": weight_map['", kv.key(), "'] is not a file name: ", kv.value().dump()));
    check_index_file_name(kv.value().get<std::string>(), index.string());
    const fs::path shard = index.parent_path() / kv.value().get<std::string>();
    std::error_code ec;
    if (!fs::is_regular_file(shard, ec))
      throw Error(str_cat(shard.string(), ": missing shard (", index.filename().string(), " puts '", kv.key(),
                          "' there)"));
    keys[kv.key()] = shard.string();
  }
  return keys;
}

}  // namespace

LingbotFiles find_lingbot_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(str_cat(dir, ": not a folder (the model is a folder)"));
  LingbotFiles f;
  f.config = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(f.config, ec)) throw Error(str_cat(f.config, ": missing (the model's config.json)"));
  const fs::path index = fs::path(dir) / kIndexName;
  if (fs::is_regular_file(index, ec)) {
    f.index = index.string();
    f.keys = read_index(index);
    return f;
  }
  const fs::path single = fs::path(dir) / kSingleName;
  if (fs::is_regular_file(single, ec)) {
    for (const auto& name : SafeTensors::open(single.string()).names()) f.keys[name] = single.string();
    return f;
  }
  std::vector<std::string> st;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") st.push_back(e.path().string());
  if (st.empty()) throw Error(str_cat(dir, ": neither ", kIndexName, " nor a .safetensors file"));
  if (st.size() > 1)
    throw Error(str_cat(dir, ": ", st.size(), " .safetensors files and neither ", kIndexName, " nor ", kSingleName,
                        " to say which holds the model"));
  for (const auto& name : SafeTensors::open(st[0]).names()) f.keys[name] = st[0];
  return f;
}

namespace {

// The keys a model's files must hold, each with the parameter giving its shape: the model's own
// parameters, and for a streamed model every block's keys shaped as its one slot's.
std::vector<std::pair<std::string, at::Tensor>> expected_keys(const LingbotDitImpl& model) {
  std::vector<std::pair<std::string, at::Tensor>> keys;
  std::vector<std::pair<std::string, at::Tensor>> slot;
  for (const auto& p : model.named_parameters(true)) {
    if (model.streamed() && p.key().rfind("blocks.0.", 0) == 0)
      slot.emplace_back(p.key().substr(9), p.value());
    else
      keys.emplace_back(p.key(), p.value());
  }
  for (int l = 0; l < model.config().num_layers && model.streamed(); ++l)
    for (const auto& [name, t] : slot) keys.emplace_back(str_cat("blocks.", l, ".", name), t);
  return keys;
}

// The shards a model reads, opened (memory-mapped) once each.
class Shards {
 public:
  explicit Shards(const LingbotFiles& files) : files_(files) {}
  const LingbotFiles& files() const { return files_; }
  SafeTensors& file(const std::string& path) {
    auto& p = open_[path];
    if (!p) p = std::make_shared<SafeTensors>(SafeTensors::open(path));
    return *p;
  }
  // Tensor `key` (checked by check_keys), refused when it holds NaN or inf.
  at::Tensor get(const std::string& key) {
    const std::string& path = files_.keys.at(key);
    at::Tensor t = file(path).get(key);
    if (!at::isfinite(t).all().item<bool>())
      throw Error(str_cat(path, ": tensor '", key, "' holds non-finite values (NaN or inf)"));
    return t;
  }

 private:
  LingbotFiles files_;
  std::map<std::string, std::shared_ptr<SafeTensors>> open_;
};

void check_key(Shards& shards, const std::string& where, const std::string& key, const at::Tensor& want) {
  const LingbotFiles& files = shards.files();
  auto it = files.keys.find(key);
  if (it == files.keys.end())
    throw Error(str_cat(where, ": missing tensor '", key, "' (expected shape ", want.sizes(), ")"));
  SafeTensors& st = shards.file(it->second);
  if (!st.contains(key))
    throw Error(str_cat(it->second, ": tensor '", key, "' is not in this shard",
                        files.index.empty() ? "" : str_cat(" (", fs::path(files.index).filename().string(),
                                                           " puts it there)")));
  const auto& e = st.entry(key);
  if (!at::isFloatingType(e.dtype))
    throw Error(str_cat(it->second, ": tensor '", key, "' is ", c10::toString(e.dtype),
                        ", a weight must be a floating-point type"));
  if (at::IntArrayRef(e.shape) != want.sizes())
    throw Error(str_cat(it->second, ": tensor '", key, "' has shape ", at::IntArrayRef(e.shape),
                        ", the model expects ", want.sizes()));
}

// Every key the model needs present with its shape, and nothing else in the files.
void check_keys(Shards& shards, const LingbotDitImpl& model) {
  const LingbotFiles& files = shards.files();
  const std::string where = files.index.empty() ? (files.keys.empty() ? "" : files.keys.begin()->second) : files.index;
  const auto keys = expected_keys(model);
  for (const auto& [key, t] : keys) check_key(shards, where, key, t);
  if (files.keys.size() != keys.size()) {
    std::set<std::string> known;
    for (const auto& kv : keys) known.insert(kv.first);
    for (const auto& kv : files.keys)
      if (!known.count(kv.first))
        throw Error(str_cat(kv.second, ": unexpected tensor '", kv.first, "' (not in LingBot-World-Fast's DiT)"));
  }
}

// A streamed model's blocks read from its files one block at a time.
class FileBlocks : public LingbotBlockSource {
 public:
  explicit FileBlocks(std::shared_ptr<Shards> shards) : shards_(std::move(shards)) {}
  void load(int layer, LingbotBlockImpl& block) override {
    at::NoGradGuard ng;
    for (const auto& p : block.named_parameters(true)) {
      const std::string key = str_cat("blocks.", layer, ".", p.key());
      at::Tensor t = shards_->get(key);
      WM_CHECK(t.sizes() == p.value().sizes(), "block ", layer, ": tensor '", key, "' has shape ", t.sizes(),
               ", the block expects ", p.value().sizes());
      p.value().copy_(t);
    }
  }

 private:
  std::shared_ptr<Shards> shards_;
};

// Checks the files against the model, copies in its resident parameters (a streamed model's slot
// excepted) and returns the shards opened.
std::shared_ptr<Shards> load_resident(LingbotDitImpl& model, const LingbotFiles& files) {
  auto shards = std::make_shared<Shards>(files);
  check_keys(*shards, model);
  at::NoGradGuard ng;
  for (const auto& p : model.named_parameters(true))
    if (!model.streamed() || p.key().rfind("blocks.", 0) != 0) p.value().copy_(shards->get(p.key()));
  return shards;
}

}  // namespace

void load_lingbot_weights(LingbotDitImpl& model, const LingbotFiles& files) {
  std::shared_ptr<Shards> shards = load_resident(model, files);
  if (model.streamed()) model.stream_blocks(std::make_shared<FileBlocks>(shards));
}

LingbotDit load_lingbot_dit(const std::string& dir, at::Device device, at::ScalarType dtype, bool streamed) {
  WM_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
           "dtype must be float32, bfloat16 or float16, got ", dtype);
  const LingbotFiles f = find_lingbot_files(dir);
  LingbotDit m(load_lingbot_config(f.config), streamed);
  if (streamed) m->to(device, dtype);  // the slot takes each block in the model's dtype as it loads
  load_lingbot_weights(*m, f);
  m->to(device, dtype);
  m->eval();
  return m;
}

namespace {

// Indices into `keys` packed in order into shards of at most `limit` bytes (a larger tensor gets
// a shard of its own).
std::vector<std::vector<size_t>> pack_shards(const std::vector<std::pair<std::string, int64_t>>& keys, int64_t limit) {
  std::vector<std::vector<size_t>> shards(1);
  int64_t used = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!shards.back().empty() && used + keys[i].second > limit) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(i);
    used += keys[i].second;
  }
  return shards;
}

}  // namespace

void save_lingbot_dit_streamed(const LingbotConfig& config, const std::vector<std::pair<std::string, int64_t>>& keys,
                               const std::function<at::Tensor(size_t)>& next, const std::string& dir,
                               int64_t shard_bytes) {
  WM_CHECK(shard_bytes > 0, "the shard size must be > 0, got ", shard_bytes);
  WM_CHECK(!keys.empty(), "a model without tensors");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str_cat(dir, ": cannot make the folder: ", ec.message()));
  const auto shards = pack_shards(keys, shard_bytes);
  write_text_atomically((fs::path(dir) / "config.json").string(), lingbot_config_to_json(config).dump(2) + "\n",
                        "save_lingbot_dit");
  nlohmann::json map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t k : shards[i]) {
      at::Tensor t = next(k);
      WM_CHECK(int64_t(t.nbytes()) == keys[k].second, keys[k].first, ": ", t.nbytes(), " bytes, announced ",
               keys[k].second);
      tensors.emplace_back(keys[k].first, std::move(t));
    }
    char name[96];
    std::snprintf(name, sizeof(name), "diffusion_pytorch_model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    const std::string file = shards.size() == 1 ? kSingleName : name;
    save_safetensors((fs::path(dir) / file).string(), tensors);
    for (const auto& kv : tensors) {
      map[kv.first] = file;
      total += int64_t(kv.second.nbytes());
    }
  }
  if (shards.size() == 1) return;
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  write_text_atomically((fs::path(dir) / kIndexName).string(), index.dump(2) + "\n", "save_lingbot_dit");
}

void save_lingbot_dit(const LingbotDitImpl& model, const std::string& dir, int64_t shard_bytes) {
  std::vector<std::pair<std::string, int64_t>> keys;
  std::vector<at::Tensor> values;
  for (const auto& p : model.named_parameters(true)) {
    keys.emplace_back(p.key(), int64_t(p.value().nbytes()));
    values.push_back(p.value().detach());
  }
  save_lingbot_dit_streamed(model.config(), keys, [&](size_t i) { return values[i]; }, dir, shard_bytes);
}

}  // namespace wm::dit
