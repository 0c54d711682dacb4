#pragma once
// The decoder's configuration, read from a Hugging Face config.json of the Llama / Qwen2
// family (model_type "llama" or "qwen2"), and the optional generation_config.json.
//
// Both config.json layouts are read: the older one (rope_theta and rope_scaling at the top, as
// most published checkpoints have it) and the one transformers 5 writes (rope_parameters
// {rope_type, rope_theta}, "dtype"). Fields this decoder does not use are ignored; fields that
// would change the computation in a way it does not implement are rejected (see from_json).
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace wm::llm {

struct LlmConfig {
  std::string model_type = "llama";  // "llama" or "qwen2"
  int64_t vocab_size = 0;            // [1, 2^24]
  int64_t hidden_size = 0;           // [1, 65536]
  int64_t intermediate_size = 0;     // [1, 2^20]
  int64_t num_hidden_layers = 0;     // [1, 1024]
  int64_t num_attention_heads = 0;   // [1, 1024]
  int64_t num_key_value_heads = 0;   // defaults to num_attention_heads; divides it
  int64_t head_dim = 0;              // defaults to hidden_size / num_attention_heads; even, [2, 1024]
  double rms_norm_eps = 1e-6;        // (0, 1)
  double rope_theta = 10000.0;       // > 0
  int64_t max_position_embeddings = 2048;  // informative only (RoPE has no table); [1, 2^30]
  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool attention_bias = false;       // biases on q, k, v (Qwen2: always; Llama: the config's flag,
                                     // which also gives Llama's o_proj a bias)
  bool mlp_bias = false;             // Llama only: biases on gate/up/down_proj
  double initializer_range = 0.02;
  std::string torch_dtype = "float32";  // the checkpoint's stored dtype: float32, float16, bfloat16
  std::vector<int64_t> bos_token_ids;   // each in [0, vocab_size)
  std::vector<int64_t> eos_token_ids;

  // Biases of the attention projections as the two families place them.
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_proj_bias() const { return model_type == "llama" && attention_bias; }

  // Reads a Hugging Face config object. Throws wm::Error "<where>: field '<name>': ..." on a
  // missing, mistyped or out-of-range value (integers are range-checked as int64, so 2^32 + 192
  // is rejected, not truncated), on heads that do not divide evenly, and on features this
  // decoder does not implement: rope_scaling other than null, rope_parameters.rope_type other
  // than "default", partial_rotary_factor != 1, use_sliding_window true, a layer_types entry
  // other than "full_attention", hidden_act other than "silu", quantization_config.
  static LlmConfig from_json(const nlohmann::json& j, const std::string& where = "config");
  // Reads a config.json file; errors name the file.
  static LlmConfig load(const std::string& path);
  // The older Hugging Face layout (rope_theta, rope_scaling null, torch_dtype), with
  // "architectures" set; from_json(to_json()) gives back the same config.
  nlohmann::json to_json() const;
  // Throws wm::Error naming the field on any out-of-range value or inconsistency.
  void validate() const;
};

// generation_config.json: the defaults a model folder suggests for sampling.
struct GenerationDefaults {
  std::vector<int64_t> eos_token_ids;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  bool do_sample = false;
  bool present = false;  // the file existed

  // Absent file: present = false and the defaults above. Throws wm::Error naming the file and
  // the field on invalid JSON, a mistyped or out-of-range value.
  static GenerationDefaults load(const std::string& path);
};

}  // namespace wm::llm
