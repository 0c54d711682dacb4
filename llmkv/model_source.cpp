#include "llmkv/model_source.h"

#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <nlohmann/json.hpp>

#include "llmkv/gguf_model.h"
#include "llmkv/gguf_tokenizer.h"
#include "llmkv/hf_folder.h"
#include "runtime/error.h"
#include "runtime/gguf.h"

namespace wm::llm {

namespace fs = std::filesystem;

namespace {

std::string token_text(const Tokenizer& t, const std::vector<int64_t>& ids) {
  if (ids.empty()) return "";
  return t.id_to_token(ids[0]).value_or("");
}

// tokenizer_config.json's chat_template (a string; the list form names several templates and
// "default" is taken), or "" when the folder has none.
std::string folder_chat_template(const std::string& folder) {
  const fs::path p = fs::path(folder) / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return "";
  std::ifstream in(p);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(str_cat(p.string(), ": not valid JSON"));
  const auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())
    for (const auto& e : *it)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
  throw Error(str_cat(p.string(), ": field 'chat_template' is neither a string nor a list with a \"default\" entry"));
}

LlmSource open_gguf(const std::string& path, at::Device device, at::ScalarType dtype, GgufWeights weights) {
  const GgufFile f = GgufFile::open(path);
  LlmSource s;
  s.path = path;
  s.gguf = true;
  s.tokenizer = tokenizer_from_gguf(f);
  s.model = load_llm_gguf(f, device, dtype, weights);
  s.name = fs::path(path).stem().string();  // an id without spaces (general.name often has them)
  s.title = gguf_model_name(f);
  s.chat_template = f.get_string("tokenizer.chat_template", "");
  malloc_trim(0);  // the tokenizer's and the check's scratch, freed, back to the system
  return s;
}

LlmSource open_folder(const std::string& path, at::Device device, at::ScalarType dtype) {
  const HfFolder h = HfFolder::open(path);
  if (h.tokenizer_file.empty()) throw Error(str_cat(path, ": the folder has no tokenizer.json"));
  LlmSource s;
  s.path = path;
  s.tokenizer = Tokenizer::load(h.tokenizer_file);
  s.model = load_llm(h, device, dtype);
  s.generation = h.generation;
  s.name = fs::path(path).lexically_normal().filename().string();
  if (s.name.empty() || s.name == ".") s.name = fs::path(path).lexically_normal().parent_path().filename().string();
  s.title = s.name;
  s.chat_template = folder_chat_template(path);
  return s;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

LlmSource open_llm(const std::string& path, at::Device device, at::ScalarType dtype, GgufWeights gguf_weights) {
  std::error_code ec;
  if (path.empty()) throw Error("no model given (a Hugging Face model folder or a .gguf file)");
  if (!fs::exists(path, ec)) throw Error(str_cat(path, ": no such file or folder"));
  LlmSource s;
  if (is_gguf_file(path))
    s = open_gguf(path, device, dtype, gguf_weights);
  else if (fs::is_directory(path, ec))
    s = open_folder(path, device, dtype);
  else
    throw Error(str_cat(path, ": neither a GGUF file (it does not start with \"GGUF\") nor a model folder"));
  s.bos_token = token_text(*s.tokenizer, s.model->config().bos_token_ids);
  s.eos_token = token_text(*s.tokenizer, s.model->config().eos_token_ids);
  return s;
}

Tokenizer open_llm_tokenizer(const std::string& path) {
  if (is_gguf_file(path)) return tokenizer_from_gguf(GgufFile::open(path));
  return Tokenizer::load((fs::path(path) / "tokenizer.json").string());
}

}  // namespace wm::llm
