#pragma once
// Perplexity of a decoder over a token sequence, as language-model evaluations report it: the
// sequence cut into windows of `window` tokens (a shorter tail is left out), each window run
// afresh from position 0, every token after a window's first scored by the log-probability the
// model gave it. perplexity = exp(mean negative log-likelihood). Float64 sums; log-softmax in
// float32 per row as the model's logits come.
#include <cstdint>
#include <functional>
#include <vector>

#include "llmkv/model.h"

namespace wm::llm {

struct PerplexityResult {
  std::vector<double> window_nll;  // per window: the sum of its scored tokens' negative log-likelihoods
  int64_t scored = 0;              // tokens scored: windows x (window - 1)
  double mean_nll = 0;
  double perplexity = 0;
};

// Throws wm::Error when window < 2, an id is outside the vocabulary, or the ids fill no window.
// on_window(done, total) after each window (progress), when given.
PerplexityResult perplexity(LlmModelImpl& model, const std::vector<int64_t>& ids, int64_t window,
                            const std::function<void(int64_t, int64_t)>& on_window = {});

}  // namespace wm::llm
