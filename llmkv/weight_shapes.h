#pragma once
// The decoder's parameters as a config declares them, without building the model: their Hugging
// Face names and shapes (what LlmModel registers, in its order), their count and bytes, and the
// check of a checkpoint's safetensors headers against them. Loading checks the headers first and
// only then allocates, at the weights' shapes, so that a config that disagrees with its
// checkpoint (vocab_size 2^22 beside a 2 MB file) costs nothing before the error; a model from a
// config alone (random weights) is bounded by the memory there is, with a message naming the
// fields that make it large.
//
// Needs only the config and the safetensors reader (no libtorch modules), so that a fuzz target
// can drive it.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "llmkv/config.h"
#include "runtime/safetensors.h"

namespace wm::llm {

using ParameterShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// The parameters of a model of `c` by name, with their shapes, in LlmModel's registration order:
// model.embed_tokens.weight [vocab, hidden]; per layer input_layernorm.weight [hidden],
// self_attn.{q,k,v}_proj.weight [heads * head_dim | kv_heads * head_dim, hidden] (biases per
// qkv_bias), o_proj.weight [hidden, heads * head_dim] (bias per o_proj_bias),
// post_attention_layernorm.weight [hidden], mlp.{gate,up}_proj.weight [intermediate, hidden],
// mlp.down_proj.weight [hidden, intermediate] (biases per mlp_bias); model.norm.weight [hidden];
// lm_head.weight [vocab, hidden] unless tied. Expects a config that passed validate().
ParameterShapes llm_parameter_shapes(const LlmConfig& c);

// Elements over all parameters (exact: every valid config stays far below 2^63).
int64_t llm_parameter_count(const LlmConfig& c);

// The bytes the parameters take in a dtype of `element_bytes`, and the fields that make them so
// large, as text: "vocab_size 4194304 x hidden_size 128 (embeddings), ...", the largest first.
std::string llm_size_fields(const LlmConfig& c);

// Bytes a context of `tokens` takes while a chunk of `chunk` tokens runs over it: K and V of every
// layer (kv_element_bytes each) and one layer's attention scores of the chunk's queries over the
// context (float32).
uint64_t llm_context_bytes(const LlmConfig& c, int64_t tokens, int64_t chunk, size_t kv_element_bytes);

// Checks that `bytes` of memory for `what` fit in the memory this process may use
// (memory_limit_bytes()). Throws wm::Error "<what> needs X GiB, more than the Y GiB of memory
// this process may use (<why>)" otherwise; `why` names the fields or options that ask for it.
void check_fits_in_memory(uint64_t bytes, const std::string& what, const std::string& why);

// The memory this process may use: the least of the machine's physical memory, the cgroup's
// memory.max (v2) or memory.limit_in_bytes (v1), and RLIMIT_AS / RLIMIT_DATA.
uint64_t memory_limit_bytes();

// Checks a checkpoint's headers against the parameters of `c` before anything is allocated:
// every parameter stored once, at its shape, as F32, F16 or BF16; nothing else but the extras a
// checkpoint may hold ("*.rotary_emb.inv_freq"; "lm_head.weight" of a tied model, at [vocab,
// hidden]); every weight_map entry (name -> shard path) in the shard it names. Returns, per
// parameter in registration order, the index into `files` of the file that holds it. Throws
// wm::Error naming the tensor, the file, the shape found and the one expected, and for a shape
// that disagrees the config fields that give it (`config_path`: "config.json" or its path);
// `folder` and `index_file` are named in the messages about missing tensors and the index.
std::vector<std::pair<std::string, size_t>> check_llm_checkpoint(const LlmConfig& c,
                                                                  const std::vector<SafeTensors>& files,
                                                                  const std::map<std::string, std::string>& weight_map,
                                                                  const std::string& folder,
                                                                  const std::string& index_file,
                                                                  const std::string& config_path);

}  // namespace wm::llm
