#pragma once
// The byte-level BPE tokenizer of a GGUF file (tokenizer.ggml.model "gpt2"), built from its
// metadata as the tokenizer.json document Hugging Face would ship for it and read by Tokenizer
// (tokenizer.h), so that one encoder serves both formats.
//
//   tokenizer.ggml.tokens       the vocabulary (byte-level strings), id = index
//   tokenizer.ggml.merges       "a b" merge rules, rank = index
//   tokenizer.ggml.token_type   1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte:
//                               control tokens become special added tokens (matched in text only
//                               when special tokens are allowed), user-defined ones non-special
//                               added tokens (always matched), as llama.cpp's tokenizer does
//   tokenizer.ggml.pre          the pre-tokenizer, by llama.cpp's names (below)
//   tokenizer.ggml.add_bos_token / bos_token_id   BOS before the text when encode adds specials
//
// Pre-tokenizers (llama.cpp's llama-vocab.cpp regexes, as Hugging Face's steps):
//   gpt2, default     ByteLevel with GPT-2's pattern
//   smollm            Digits (each digit alone), then ByteLevel with GPT-2's pattern
//   llama-bpe         Llama 3's split pattern (numbers in runs of up to 3), ignore_merges
//   qwen2             Qwen2's split pattern (each digit alone)
// Another name, or a tokenizer.ggml.model other than gpt2 (llama's SentencePiece, bert's
// WordPiece), is refused with an error naming the key and the value.
#include <nlohmann/json_fwd.hpp>

#include <string>

#include "llmkv/tokenizer.h"
#include "runtime/gguf.h"

namespace wm::llm {

// The tokenizer.json document of the file's tokenizer. Throws wm::Error naming the file and the key.
nlohmann::json gguf_tokenizer_json(const GgufFile& file);

// Tokenizer::from_json(gguf_tokenizer_json(file)), its origin the file's path.
Tokenizer tokenizer_from_gguf(const GgufFile& file);

}  // namespace wm::llm
