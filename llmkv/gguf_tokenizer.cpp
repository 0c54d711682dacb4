#include "llmkv/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "llmkv/split_regex.h"
#include "runtime/error.h"

namespace wm::llm {

namespace {

using json = nlohmann::json;

// llama.cpp's token types (llama-vocab.h, LLAMA_TOKEN_TYPE_*).
enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

json split_step(const char* pattern) {
  return {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// The pre-tokenizer steps of llama.cpp's pre-tokenizer `pre` (tokenizer.ggml.pre).
json pre_tokenizer(const GgufFile& f, const std::string& pre) {
  if (pre == "gpt2" || pre == "default") return byte_level(true);
  if (pre == "smollm")
    return {{"type", "Sequence"},
            {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)})}};
  if (pre == "llama-bpe" || pre == "llama3")
    return {{"type", "Sequence"}, {"pretokenizers", json::array({split_step(kLlama3SplitPattern), byte_level(false)})}};
  if (pre == "qwen2")
    return {{"type", "Sequence"}, {"pretokenizers", json::array({split_step(kQwen2SplitPattern), byte_level(false)})}};
  throw Error(str_cat(f.path(), ": key 'tokenizer.ggml.pre' is \"", pre,
                      "\", a pre-tokenizer this runtime does not know (gpt2, smollm, llama-bpe, qwen2)"));
}

json added_tokens(const GgufFile& f, const std::vector<std::string>& tokens) {
  json added = json::array();
  if (!f.has("tokenizer.ggml.token_type")) return added;
  const std::vector<int64_t> types = f.get_i64_array("tokenizer.ggml.token_type");
  if (types.size() != tokens.size())
    throw Error(str_cat(f.path(), ": key 'tokenizer.ggml.token_type' has ", types.size(), " entries for ",
                        tokens.size(), " tokens"));
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] != kControl && types[id] != kUserDefined) continue;
    const bool special = types[id] == kControl;
    added.push_back({{"id", id},           {"content", tokens[id]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false},    {"normalized", !special}, {"special", special}});
  }
  return added;
}

// BOS before the text when the file asks for it (tokenizer.ggml.add_bos_token).
json post_processor(const GgufFile& f, const std::vector<std::string>& tokens) {
  const bool add_bos = f.has("tokenizer.ggml.add_bos_token") && f.get_bool("tokenizer.ggml.add_bos_token");
  if (!add_bos) return nullptr;
  const int64_t bos = f.get_i64("tokenizer.ggml.bos_token_id");
  if (bos < 0 || bos >= static_cast<int64_t>(tokens.size()))
    throw Error(str_cat(f.path(), ": key 'tokenizer.ggml.bos_token_id' is ", bos, ", not a token"));
  const std::string& name = tokens[bos];
  return {{"type", "TemplateProcessing"},
          {"single", json::array({{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"pair", json::array()},
          {"special_tokens", {{name, {{"id", name}, {"ids", {bos}}, {"tokens", {name}}}}}}};
}

}  // namespace

json gguf_tokenizer_json(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw Error(str_cat(f.path(), ": key 'tokenizer.ggml.model' is \"", model,
                        "\"; only byte-level BPE tokenizers (\"gpt2\") are supported"));
  const std::string pre = f.get_string("tokenizer.ggml.pre", "default");
  const std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  json vocab = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (vocab.contains(tokens[id]))
      throw Error(str_cat(f.path(), ": key 'tokenizer.ggml.tokens': token ", id, " repeats token ",
                          vocab[tokens[id]].get<int64_t>()));
    vocab[tokens[id]] = id;
  }
  json m = {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", pre == "llama-bpe" || pre == "llama3"},
            {"vocab", std::move(vocab)},
            {"merges", f.get_string_array("tokenizer.ggml.merges")}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added_tokens(f, tokens)},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer(f, pre)},
          {"post_processor", post_processor(f, tokens)},
          {"decoder", byte_level(true)},
          {"model", std::move(m)}};
}

Tokenizer tokenizer_from_gguf(const GgufFile& f) { return Tokenizer::from_json(gguf_tokenizer_json(f), f.path()); }

}  // namespace wm::llm
