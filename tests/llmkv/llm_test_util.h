#pragma once
// Helpers shared by the LLM path's tests.
#include "llmkv/config.h"
#include "llmkv/model.h"

namespace wm::llm::test {

// A small Qwen2-like config (GQA 4/2, head dim 8, biases, tied head) with large random weights,
// so that its next-token distributions are peaked and differ from step to step.
inline LlmConfig small_config(int64_t vocab = 61, int64_t intermediate = 48) {
  LlmConfig c;
  c.model_type = "qwen2";
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 512;
  c.initializer_range = 0.2;
  c.validate();
  return c;
}

// That model with weights from `seed`, in eval mode.
inline LlmModel random_model(int64_t vocab, uint64_t seed, int64_t intermediate = 48) {
  LlmModel m(small_config(vocab, intermediate));
  m->init_weights(seed);
  m->eval();
  return m;
}

}  // namespace wm::llm::test
