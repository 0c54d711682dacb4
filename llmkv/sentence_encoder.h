#pragma once
// Sentence embeddings: a BERT encoder (llmkv/bert.h) with its WordPiece tokenizer
// (llmkv/wordpiece.h), mean-pooled over the tokens and L2-normalised, as sentence-transformers
// computes them for all-MiniLM-L6-v2. The dot product of two embeddings is their cosine
// similarity.
//
// A model folder, as sentence-transformers saves one (the extra files are optional):
//   config.json                  model_type "bert"
//   model.safetensors            F32, F16 or BF16; computed in float32
//   tokenizer.json               WordPiece
//   sentence_bert_config.json    optional: max_seq_length, the truncation length
//   1_Pooling/config.json        optional: must ask for mean pooling when present
//
// Texts longer than max_length() tokens (template included) are truncated, as
// sentence-transformers does: to sentence_bert_config.json's max_seq_length (256 for
// all-MiniLM-L6-v2), else to max_position_embeddings, or to the length given to load.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "llmkv/bert.h"
#include "llmkv/text_policy.h"
#include "llmkv/tokenizer.h"
#include "llmkv/wordpiece.h"

namespace wm::llm {

class SentenceEncoder {
 public:
  // Loads the folder onto `device`. max_length 0: as above; else that many tokens at most
  // (<= max_position_embeddings). Throws wm::Error naming the file: no such folder, a missing
  // file, an invalid config (naming the field), a tokenizer.json that is not WordPiece, a
  // vocabulary larger than the model's, pooling other than mean; and as load_bert_weights for a
  // missing, unexpected or mis-shaped tensor.
  static SentenceEncoder load(const std::string& folder, at::Device device, int64_t max_length = 0);

  // The embeddings of `texts`: [n, dim()] float32 on the model's device, each row of unit L2
  // norm (a text with no token but the template's still gets one: its [CLS] and [SEP] pooled).
  // Texts are sorted by length and run in batches of up to batch_size(), padded within a batch; a
  // batch holds no text shorter than half its longest.
  // n = 0 gives [0, dim()]. Takes any bytes (see WordPieceTokenizer::encode) and throws no
  // wm::Error; a failure of the device comes as c10::Error.
  at::Tensor embed(const std::vector<std::string>& texts) const;

  // The mean-pooled, normalised embeddings of one padded batch: ids, type_ids, mask [B, T]
  // int64 (as WordPieceTokenizer::encode_batch gives them) -> [B, dim()] float32. Throws as
  // BertModelImpl::forward.
  at::Tensor embed_ids(const at::Tensor& ids, const at::Tensor& type_ids, const at::Tensor& mask) const;

  int64_t dim() const { return model_->config().hidden_size; }
  int64_t max_length() const { return max_length_; }
  int64_t batch_size() const { return batch_size_; }
  // How many texts one forward pass takes at most (>= 1; 32 by default, as sentence-transformers).
  void set_batch_size(int64_t n);
  at::Device device() const { return model_->device(); }
  const WordPieceTokenizer& tokenizer() const { return tokenizer_; }
  const BertConfig& config() const { return model_->config(); }

 private:
  SentenceEncoder(BertModel model, WordPieceTokenizer tokenizer, int64_t max_length)
      : model_(std::move(model)), tokenizer_(std::move(tokenizer)), max_length_(max_length) {}
  BertModel model_;
  WordPieceTokenizer tokenizer_;
  int64_t max_length_;
  int64_t batch_size_ = 32;
};

// The embedder evoke's relevance "embedding" takes: token ids of the decoder's tokenizer ->
// decoded text without special tokens (ChatML's <|im_start|> and <|im_end|> say nothing of a
// turn's topic) -> the encoder's embeddings, on the CPU. Both handles are shared.
TextEmbedder sentence_embedder(std::shared_ptr<const SentenceEncoder> encoder, Tokenizer decoder_tokenizer);

}  // namespace wm::llm
