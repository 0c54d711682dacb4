#pragma once
// Llama and Qwen2 decoders from GGUF files (llama.cpp's format: runtime/gguf.h): the config from
// the file's metadata, the weights by llama.cpp's tensor names, the tokenizer from
// tokenizer.ggml.* (gguf_tokenizer.h).
//
// Config (general.architecture "llama" or "qwen2", keys prefixed by the architecture):
//   block_count, embedding_length, feed_forward_length, attention.head_count,
//   attention.head_count_kv (default head_count), attention.layer_norm_rms_epsilon,
//   rope.freq_base (default 10000), context_length, attention.key_length / value_length (when
//   present: equal to embedding_length / head_count), rope.dimension_count (when present: the
//   whole head), vocab_size (default: the tokenizer's token count). Refused, with the key named:
//   another architecture, RoPE scaling (rope.scaling.type other than "none", a rope_freqs
//   tensor), a partial rotary dimension, an expert count.
//
// Tensors (llama.cpp's names; dims in ggml order, reversed here): token_embd, output_norm,
// output (absent: tied to token_embd), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
// ffn_norm, ffn_gate, ffn_up, ffn_down}.weight, and blk.N.attn_{q,k,v}.bias (Qwen2; a Llama file
// with them gets attention_bias). Every tensor is checked against the config's shapes and its
// type against what runtime/gguf_quants decodes before any parameter is allocated; a tensor the
// model has no place for is an error.
//
// Llama's Q and K: llama.cpp's converter permutes the rows of q_proj and k_proj so that each
// head's rotary pairs are adjacent (ggml's "normal" RoPE); Hugging Face pairs dimension i with
// i + head_dim / 2 ("rotate half", which this model runs). The loader undoes the permutation:
// HF row (h, half, i) = GGUF row (h, i, half). Qwen2 files are converted unpermuted (NeoX RoPE).
#include <ATen/ATen.h>

#include <string>

#include "llmkv/config.h"
#include "llmkv/model.h"
#include "runtime/gguf.h"

namespace wm::llm {

// The decoder's config from a GGUF file's metadata (see above). Throws wm::Error naming the file
// and the key.
LlmConfig llm_config_from_gguf(const GgufFile& file);

// How a GGUF file's weights are held.
enum class GgufWeights {
  Stored,  // the quantized projections, LM head and embedding as the file's blocks (quant_gemv.h:
           // resident memory about the file's size), the rest decoded; CPU and float32 only
  Float,   // every tensor decoded (runtime/gguf_quants: bit for bit gguf-py's values), then
           // converted to the dtype
};

// The model of a GGUF file on `device` in `dtype` (float32, float16 or bfloat16), Q/K rows
// unpermuted for Llama (quantized rows reordered as stored). Stored on another device or dtype
// falls back to Float. Throws wm::Error naming the file and the tensor on a missing, unexpected or
// mis-shaped tensor, an unsupported type, non-finite values, or a model larger than memory.
LlmModel load_llm_gguf(const GgufFile& file, at::Device device, at::ScalarType dtype = at::kFloat,
                       GgufWeights weights = GgufWeights::Float);

// Undoes llama.cpp's Q/K row permutation on w [n_heads * head_dim, ...] (any dtype, any trailing
// dims). Exposed for the tests, which apply the converter's permutation and check the round trip.
at::Tensor unpermute_qk_rows(const at::Tensor& w, int64_t n_heads);
// llama.cpp's converter's permutation (LlamaModel.permute), the inverse of the above.
at::Tensor permute_qk_rows(const at::Tensor& w, int64_t n_heads);

// The model's name as GGUF files give it (general.name), else the file's name without .gguf.
std::string gguf_model_name(const GgufFile& file);

}  // namespace wm::llm
