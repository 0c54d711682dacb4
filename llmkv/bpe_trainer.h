#pragma once
// Trains a byte-level BPE tokenizer from text.
//
// Text is cut at the special tokens (their text never enters the counts), then into pre-tokens by
// the split pattern (kept as Isolated pieces, matches and gaps), and the distinct pre-tokens are
// counted. Training starts from the 256 byte symbols and repeatedly merges the adjacent pair with
// the highest count over all pre-tokens (weighted by their counts); ties go to the pair whose
// (left id, right id) is smallest. Pair counts are updated incrementally: a merge touches only the
// pre-tokens holding the pair. A merge whose bytes equal an existing token reuses its id (the
// merge is still recorded). Training stops at the target vocab size or when no pair occurs
// min_frequency times.
//
// The result: ids 0..k-1 are the special tokens (in the model vocab and in added_tokens, special,
// not normalized), ids k..k+255 the byte symbols in byte order, then the merged tokens in the
// order they were made. Its tokenizer.json (Tokenizer::save) has no normalizer, a Qwen2-style
// pre-tokenizer (Split on the pattern, then ByteLevel without regex) or GPT-2's (ByteLevel with
// use_regex), and ByteLevel post-processor and decoder.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "llmkv/tokenizer.h"

namespace wm::llm {

class SplitRegex;

enum class SplitStyle {
  Qwen2,  // kQwen2SplitPattern in a Split step, then ByteLevel(use_regex = false)
  Gpt2,   // ByteLevel(use_regex = true): kGpt2SplitPattern
};

struct BpeTrainerOptions {
  int64_t vocab_size = 1000;  // special tokens + 256 bytes + merged tokens
  SplitStyle style = SplitStyle::Qwen2;
  std::vector<std::string> special_tokens;  // e.g. <|endoftext|>, <|im_start|>, <|im_end|>
  int64_t min_frequency = 2;                // a pair must occur this often to be merged
};

class BpeTrainer {
 public:
  // Throws wm::Error when vocab_size is below special tokens + 256, a special token is empty or
  // repeated, or min_frequency < 1.
  explicit BpeTrainer(BpeTrainerOptions options);

  // Counts the pre-tokens of `text` (any bytes).
  void feed(std::string_view text);
  // Feeds the texts `next` produces until it returns false (it fills its argument and returns
  // true while there is text).
  void feed_all(const std::function<bool(std::string&)>& next);

  // Trains on everything fed so far; the trainer may be fed more and trained again.
  Tokenizer train() const;

  // The number of distinct pre-tokens counted so far.
  size_t n_words() const { return words_.size(); }

  // Feeds `corpus` and trains.
  static Tokenizer train(const std::vector<std::string>& corpus, const BpeTrainerOptions& options);
  static Tokenizer train(const std::function<bool(std::string&)>& next, const BpeTrainerOptions& options);

 private:
  BpeTrainerOptions opt_;
  std::shared_ptr<const SplitRegex> split_;
  std::unordered_map<std::string, int64_t> words_;
};

}  // namespace wm::llm
