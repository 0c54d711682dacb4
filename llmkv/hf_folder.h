#pragma once
// Hugging Face model folders of the Llama / Qwen2 family: config.json, generation_config.json
// (optional), and the weights as model.safetensors or model.safetensors.index.json plus the
// shards its weight_map names. Weights load by their Hugging Face names (model.h mirrors them).
//
// What the loader accepts in the weights, beside exactly the model's parameters:
//   - "*.rotary_emb.inv_freq" (a buffer older checkpoints saved; RoPE is recomputed here);
//   - "lm_head.weight" when tie_word_embeddings is true: transformers saves tied models without
//     it and, when a file has it, ignores it in favour of the embeddings; so does this loader
//     (its shape must still be [vocab, hidden]).
// Anything else is an error, as is a missing or mis-shaped tensor, and a stored dtype other than
// F32, F16 or BF16 (converted to the requested dtype on load).
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "llmkv/config.h"
#include "llmkv/model.h"

namespace wm::llm {

struct HfFolder {
  std::string path;                // the folder
  LlmConfig config;                // from config.json
  GenerationDefaults generation;   // from generation_config.json (present = false if absent)
  std::string index_file;          // model.safetensors.index.json, or empty (one model.safetensors)
  std::vector<std::string> weight_files;          // paths, in the order read (shards sorted)
  std::map<std::string, std::string> weight_map;  // index only: tensor name -> shard path
  std::string tokenizer_file;      // tokenizer.json if the folder has one, else empty

  // Reads config.json and generation_config.json and finds the weight files: model.safetensors
  // if present, else the index and every shard its weight_map names. Opens no weights. Throws
  // wm::Error naming the file: an empty path, no folder, no config.json, an invalid config
  // (naming the field), an eos_token_id of generation_config.json outside config.json's
  // vocabulary, a file that is a folder or a link to nothing, no weights, an index that is not
  // valid JSON, has no weight_map, or names a shard that does not exist (or a path outside the
  // folder).
  static HfFolder open(const std::string& folder);
};

// Copies the folder's weights into `model` by name, converted to the model's dtype and device.
// Everything is checked before any parameter changes. Throws wm::CorruptData naming the file
// for a damaged or truncated safetensors file; wm::Error naming the tensor, the file, and the
// expected and found shapes for a missing, unexpected or mis-shaped tensor, a tensor stored in
// two files, an index entry whose shard lacks the tensor, or an unsupported stored dtype.
void load_llm_weights(LlmModelImpl& model, const HfFolder& folder);

// A model built from the folder's config with its weights, on `device` in `dtype` (float32,
// float16 or bfloat16). The weights' headers are checked against the config first
// (check_llm_checkpoint, weight_shapes.h: a mismatch names the config's fields), then the
// parameters' bytes against the memory there is, and only then are the parameters allocated,
// in `dtype`, uninitialised until the weights are copied in. Throws as HfFolder::open and
// load_llm_weights, and wm::Error for another dtype or a model larger than memory.
LlmModel load_llm(const HfFolder& folder, at::Device device, at::ScalarType dtype = at::kFloat);
LlmModel load_llm(const std::string& folder, at::Device device, at::ScalarType dtype = at::kFloat);

// Writes `model` as a Hugging Face folder (created if needed): config.json (LlmConfig::to_json
// with torch_dtype set to the parameters' dtype) and one model.safetensors (metadata format
// "pt"; no lm_head.weight when the embeddings are tied), each written to a temporary name and
// renamed. A model.safetensors.index.json left in the folder by an earlier sharded save is
// removed with the shards it names, so that the folder holds one set of weights. Throws
// wm::Error on an I/O failure.
void save_llm(const std::string& folder, LlmModelImpl& model);

}  // namespace wm::llm
