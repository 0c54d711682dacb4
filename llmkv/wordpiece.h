#pragma once
// The WordPiece tokenizer of BERT-family encoders (bert-base-uncased, all-MiniLM-L6-v2, ...), read
// from a Hugging Face tokenizer.json whose model is "WordPiece", and encoding as that library
// does.
//
// encode(text):
//   0. Bytes that are not valid UTF-8 become U+FFFD (which clean_text then removes); the
//      reference takes only valid text.
//   1. Added tokens are cut out first: those with normalized = false from the raw text, then, in
//      each remaining piece after normalization, those with normalized = true (their contents
//      normalized too). At each position the leftmost match wins, the longest among those
//      starting there. So "[CLS]" in the text is the token [CLS]; "[cls]" is three words.
//   2. BertNormalizer, per character, in this order: clean_text (remove NUL, U+FFFD, control and
//      format characters; other white space becomes ' '), handle_chinese_chars (' ' on both
//      sides of a CJK ideograph), strip_accents (canonical decomposition, Mn marks removed; null
//      in the file means "as lowercase"), lowercase. Character data: llmkv/bert_chars.h.
//   3. BertPreTokenizer: split on white space (dropped) and on punctuation (each mark a word of
//      its own: ASCII punctuation and the P* categories).
//   4. WordPiece, per word: a word of more than max_input_chars_per_word characters is the unk
//      token; otherwise greedy longest match from the left, pieces after the first looked up
//      with continuing_subword_prefix ("##"); a word with a rest no vocab entry matches is the
//      unk token, whole.
//   5. With add_special, the post-processor's template for one sequence: [CLS] A [SEP] as BERT
//      has it (TemplateProcessing or BertProcessing), with its token type ids.
//   6. With max_length > 0, truncation as the reference's LongestFirst, stride 0, right side: the
//      text's tokens are cut so that the whole, template included, has at most max_length ids.
//
// What a file may hold (anything else is refused with a wm::Error naming the file and the field;
// a malformed file is a wm::CorruptData):
//   model: type "WordPiece", vocab {token: id}, unk_token (in the vocab), continuing_subword_prefix
//          (default "##"), max_input_chars_per_word (default 100).
//   added_tokens: id, content, special, normalized; single_word, lstrip and rstrip must be false.
//   normalizer: null or BertNormalizer. pre_tokenizer: BertPreTokenizer.
//   post_processor: null, TemplateProcessing (its "single" template) or BertProcessing.
//   truncation, padding: read for max_length and pad_id only; encode applies neither by itself.
//   decoder: not read (this class does not decode).
//
// A WordPieceTokenizer is immutable once built; copies share it, and all const methods may run
// from several threads at once.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace wm::llm {

// One text's ids and their token type ids (same length).
struct WordPieceEncoding {
  std::vector<int64_t> ids;
  std::vector<int64_t> type_ids;
};

// Texts encoded and padded on the right to the longest: row-major [rows, length] each.
struct WordPieceBatch {
  int64_t rows = 0;
  int64_t length = 0;
  std::vector<int64_t> ids;             // pad_id() after each text's end
  std::vector<int64_t> type_ids;        // 0 after each text's end
  std::vector<int64_t> attention_mask;  // 1 over each text's ids, 0 over the padding
};

class WordPieceTokenizer {
 public:
  // Reads and checks a tokenizer.json. Throws wm::Error when the file cannot be read or is not a
  // WordPiece tokenizer of the kind above (naming the file and what it holds instead),
  // wm::CorruptData when it is not valid JSON or is malformed (a missing field, an unk_token not
  // in the vocab, two tokens with one id, ...).
  static WordPieceTokenizer load(const std::string& path);
  // As load, from a parsed document; `origin` names it in error messages.
  static WordPieceTokenizer from_json(const nlohmann::json& j, const std::string& origin);

  // The ids of `text` (any bytes; see the steps above). add_special: the template around them.
  // max_length: 0 for no truncation, else the most ids returned. Throws wm::Error when
  // max_length is negative or leaves no room for a text token beside the template's.
  WordPieceEncoding encode(std::string_view text, bool add_special = true, int64_t max_length = 0) const;

  // encode() of each text, padded to the longest. Throws as encode.
  WordPieceBatch encode_batch(const std::vector<std::string>& texts, bool add_special = true,
                              int64_t max_length = 0) const;

  // The normalizer's output for a text without added tokens (UTF-8). Never throws.
  std::string normalize(std::string_view text) const;
  // The pre-tokenizer's words of an already normalized text (UTF-8). Never throws.
  std::vector<std::string> pre_tokenize(std::string_view normalized) const;

  // The token's string; nullopt when no token has this id.
  std::optional<std::string> id_to_token(int64_t id) const;
  // The id of a token string (added tokens first, then the vocab); nullopt when absent.
  std::optional<int64_t> token_to_id(const std::string& token) const;

  // One more than the largest id of the vocab and the added tokens.
  int64_t vocab_size() const;
  int64_t unk_id() const;
  // The padding section's pad_id, else the id of "[PAD]", else 0.
  int64_t pad_id() const;
  // The truncation section's max_length, 0 when the file has none (encode does not apply it).
  int64_t file_max_length() const;
  // How many ids the template adds around a text (2 for [CLS] A [SEP], 0 without a template).
  int64_t n_template_tokens() const;
  // Where this tokenizer came from (a path or an origin).
  const std::string& origin() const;

 private:
  struct Impl;
  explicit WordPieceTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace wm::llm
