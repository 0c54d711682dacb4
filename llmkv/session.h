#pragma once
// A text session over the decoder: the context lives in one KvWindow with named regions
// ([system | blocks | recent] by default) and grows as prompts are fed and tokens generated;
// generate() prefills a prompt in chunks, then samples token by token, streaming text, until a
// stop token, a stop string or the token limit. Programs drive it; memory policies act on its
// window.
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llmkv/model.h"
#include "llmkv/sampling.h"
#include "llmkv/tokenizer.h"
#include "runtime/window.h"

namespace wm::llm {

struct SessionOptions {
  int64_t prefill_chunk = 512;  // prompt tokens per forward pass
  std::vector<std::string> regions = {"system", "blocks", "recent"};
  int64_t reserve_tokens = 0;   // window capacity preallocated per layer
  void validate() const;        // throws wm::Error naming the field
};

struct GenerateOptions {
  SamplingOptions sampling;
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_tokens;       // generation ends on these (not shown in the text)
  std::vector<std::string> stop_strings;  // generation ends when the text shows one (cut there)
  void validate() const;                  // throws wm::Error naming the field
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  double prefill_s = 0.0;  // the prompt's forward passes
  double ttft_s = 0.0;     // from the call to the first new token
  double decode_s = 0.0;   // the forward passes of generated tokens after the first
  size_t kv_bytes_used = 0;
  size_t kv_bytes_allocated = 0;
  double prefill_tokens_per_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0.0; }
  // Tokens after the first over the time their forward passes took.
  double decode_tokens_per_s() const { return decode_s > 0 ? (new_tokens - 1) / decode_s : 0.0; }
};

struct Generation {
  std::vector<int64_t> tokens;  // generated, the stop token included when one ended it
  std::string text;             // decoded, cut before a stop string, without a stop token
  std::string stop_reason;      // "stop_token", "stop_string" or "max_tokens"
  at::Tensor prompt_logits;     // [vocab] float32 (CPU) at the prompt's last position
  GenerationStats stats;
};

using TextCallback = std::function<void(const std::string&)>;

class LlmSession {
 public:
  // The tokenizer gives stop strings and text (a shared handle: copying it is cheap).
  LlmSession(LlmModel model, Tokenizer tokenizer, at::Device device, at::ScalarType dtype = at::kFloat,
             SessionOptions opt = {});

  // Appends tokens to the context (to `segment` of `region`; empty segment: the region's own
  // name), in chunks of prefill_chunk, after any generated token not yet fed. Returns the
  // logits [vocab] (float32, CPU) at the last token. Throws wm::Error on an empty input or an
  // id outside the vocabulary.
  at::Tensor feed(const std::vector<int64_t>& ids, const std::string& region = "recent",
                  const std::string& segment = "");

  // Feeds the prompt (may be empty right after feed() or a generation: the context then ends
  // where generation starts), then generates. on_text receives the text as it becomes final.
  // Ids the model has beyond the tokenizer's vocabulary are never sampled. Each call draws a
  // random stream of its own (seed and call count). Throws wm::Error on bad options or ids; a
  // failed feed leaves the context as it was.
  Generation generate(const std::vector<int64_t>& prompt, const GenerateOptions& opt, const TextCallback& on_text = {});

  // The position the next token takes (tokens in the context, a pending generated one included).
  int64_t next_position() const { return next_pos_ + (pending_ ? 1 : 0); }
  const KvWindow& window() const { return window_; }
  KvWindow& window() { return window_; }
  LlmModelImpl& model() { return *model_; }
  const Tokenizer& tokenizer() const { return tok_; }
  at::Device device() const { return device_; }
  // Empties the context.
  void reset();

 private:
  at::Tensor run(const std::vector<int64_t>& ids, const std::string& region, const std::string& segment);

  LlmModel model_;
  Tokenizer tok_;
  at::Device device_;
  SessionOptions opt_;
  KvWindow window_;
  int64_t next_pos_ = 0;
  std::optional<int64_t> pending_;  // the last generated token, not yet run through the model
  at::Tensor last_logits_;          // [vocab] at the last token run (CPU)
  int64_t generations_ = 0;         // generate() calls so far (each draws its own random stream)
};

}  // namespace wm::llm
