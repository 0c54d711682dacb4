#pragma once
// What the LLM programs open with -m: a Hugging Face model folder (config.json, safetensors,
// tokenizer.json; hf_folder.h) or a GGUF file (gguf_model.h, gguf_tokenizer.h), told apart by
// the file's first four bytes ("GGUF"), so that a file named anything loads as what it is.
// One call gives the model, its tokenizer, the generation defaults, a name for it and the chat
// template the files carry.
#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "llmkv/config.h"
#include "llmkv/gguf_model.h"
#include "llmkv/model.h"
#include "llmkv/tokenizer.h"

namespace wm::llm {

struct LlmSource {
  std::string path;
  bool gguf = false;
  LlmModel model{nullptr};
  std::optional<Tokenizer> tokenizer;
  GenerationDefaults generation;  // generation_config.json (folders); absent for GGUF files
  std::string name;               // an id: the GGUF file's name without .gguf, or the folder's name
  std::string title;              // for people: GGUF general.name (else the file's stem), or the folder's name
  std::string chat_template;      // GGUF tokenizer.chat_template or tokenizer_config.json's; may be empty
  std::string bos_token, eos_token;  // the texts of the BOS / EOS tokens ("" when the model has none)
};

// True when `path` is a regular file that starts with GGUF's magic.
bool is_gguf_file(const std::string& path);

// Opens a folder or a GGUF file: the model on `device` in `dtype`, the tokenizer and the rest.
// Throws wm::Error naming the path: nothing there, a folder without what it needs, a file that
// is not GGUF, and everything hf_folder.h / gguf_model.h refuse.
// A GGUF file's weights are held as `gguf_weights` says (gguf_model.h: by default the quantized
// blocks as stored, on the CPU in float32).
LlmSource open_llm(const std::string& path, at::Device device, at::ScalarType dtype = at::kFloat,
                   GgufWeights gguf_weights = GgufWeights::Stored);

// The tokenizer alone (what a program that needs no weights opens): tokenizer.json of a folder,
// the metadata of a GGUF file.
Tokenizer open_llm_tokenizer(const std::string& path);

}  // namespace wm::llm
