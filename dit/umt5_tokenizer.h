#pragma once
// umT5's tokenizer as LingBot-World-Fast calls it: upstream's
// HuggingfaceTokenizer(name='google/umt5-xxl', seq_len=text_len, clean='whitespace') called with
// return_mask=True, add_special_tokens=True (Robbyant/lingbot-world 91ff5f6, wan/modules/t5.py and
// tokenizers.py): the prompt cleaned (dit/umt5_text.h), transformers' T5 tokenizer over the
// SentencePiece model `spiece.model` (unigram), EOS appended, truncated to text_len keeping the EOS,
// padded with the pad id, and the mask of the real tokens.
//
// Tokenization is SentencePiece's own (libsentencepiece, Debian's libsentencepiece-dev), with what
// transformers adds around it: the strings of the model's pad, EOS and unknown pieces ("<pad>",
// "</s>", "<unk>") written in the prompt are those tokens (transformers' added tokens, matched
// leftmost-longest, never normalised), and SentencePiece encodes the text between them.
//
// Without libsentencepiece at build time the class still exists and its constructor throws
// (umt5_tokenizer_available() says which).
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wm::dit {

// Whether this build has libsentencepiece (the tokenizer works); the cleaning does not need it.
bool umt5_tokenizer_available();

class Umt5Tokenizer {
 public:
  // Loads the SentencePiece model file. Throws wm::Error naming the file when it cannot be read or
  // parsed, when the model has no EOS or pad piece, or when the build has no libsentencepiece.
  explicit Umt5Tokenizer(const std::string& spiece_model);
  ~Umt5Tokenizer();
  Umt5Tokenizer(Umt5Tokenizer&&) noexcept;
  Umt5Tokenizer& operator=(Umt5Tokenizer&&) noexcept;

  // The ids of one prompt, EOS appended, not truncated. `clean`: upstream's 'whitespace' cleaning
  // first (umt5_clean_whitespace). Throws wm::Error on invalid UTF-8.
  std::vector<int64_t> encode(const std::string& text, bool clean = true) const;

  // Upstream's call on a batch: ids [B, text_len] int64 (each prompt's ids truncated to
  // text_len - 1 tokens then EOS, padded with pad_id) and mask [B, text_len] int64 (1 on the real
  // tokens, EOS included). text_len >= 1.
  struct Batch {
    at::Tensor ids, mask;
  };
  Batch operator()(const std::vector<std::string>& texts, int64_t text_len) const;

  int64_t pad_id() const;
  int64_t eos_id() const;
  int64_t vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wm::dit
