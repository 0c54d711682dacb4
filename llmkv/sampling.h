#pragma once
// Choosing the next token from logits: greedy, or temperature with top-k and top-p (nucleus)
// filtering, drawn with the project's own seeded generator so that a seed gives the same text
// on every machine and libtorch version. And the stop rules of a generation: stop tokens, stop
// strings (matched on the decoded text, held back from a stream until they cannot match), a
// token limit.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wm::llm {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax; the lowest id among ties)
  int64_t top_k = 0;         // 0: no top-k filter
  double top_p = 1.0;        // 1: no nucleus filter; in (0, 1]
  uint64_t seed = 0;

  // Throws wm::Error naming the field on a negative or NaN temperature, a negative top_k, or a
  // top_p outside (0, 1].
  void validate() const;
  bool greedy() const { return temperature == 0.0; }
};

class TokenSampler {
 public:
  explicit TokenSampler(SamplingOptions opt);
  // Picks a token from logits [vocab] (any float dtype, any device). Greedy when temperature
  // is 0; otherwise softmax(logits / T) in float64, keeps the top_k most probable, then the
  // smallest prefix (by descending probability) whose mass reaches top_p, renormalises and
  // draws. Throws wm::Error if the logits are not 1-D or contain NaN.
  int64_t sample(const at::Tensor& logits);
  const SamplingOptions& options() const { return opt_; }

 private:
  double uniform();  // in [0, 1)
  SamplingOptions opt_;
  uint64_t state_;
};

// Log-softmax of logits [vocab] in float64 on the CPU (beam scores).
at::Tensor log_probs64(const at::Tensor& logits);

// The most alternatives token_logprob() gives (OpenAI's limit on top_logprobs): what a server
// keeps per generated token stays bounded.
constexpr int64_t kMaxTopLogprobs = 20;

// A token's log-probability under the model's distribution, log_softmax of the raw logits (before
// temperature, top-k and top-p), and the `top` most probable tokens with theirs.
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0.0;
  std::vector<std::pair<int64_t, double>> top;  // (id, logprob), most probable first, ties by lower id
};

// `token`'s log-probability in logits [vocab] (any float dtype, any device; computed in float64 on
// the CPU) and the `top` most probable tokens. Throws wm::Error if the logits are not 1-D, the
// token is out of range or top is outside [0, kMaxTopLogprobs].
TokenLogprob token_logprob(const at::Tensor& logits, int64_t token, int64_t top);

// Watches the decoded text of a generation for stop strings. feed() takes the new text of each
// token and returns what may be shown now: text is held back while it could still be the start
// of a stop string. Once a stop string appears, stopped() is true and the text up to (without)
// it has been returned; the rest is discarded.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  std::string feed(const std::string& text);
  // The held-back text, at the end of a generation that stopped for another reason.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace wm::llm
