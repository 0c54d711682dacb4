#pragma once
// The byte-level BPE tokenizer of the LLM path, read from a Hugging Face tokenizer.json of the
// kind GPT-2, Llama-3 and Qwen2 ship, and encoding as that library does.
//
// encode(text):
//   1. Added tokens are cut out of the raw text first: those with normalized = false, then, in
//      what is left, those with normalized = true. At each position the leftmost match wins, the
//      longest among those starting there. Honoured: single_word (a match touching a word
//      character, [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}] or a joiner, on either side is not a match),
//      lstrip / rstrip (the token swallows the Unicode White_Space run on its left / right, so
//      decode does not give that white space back). Matching resumes after the swallowed white
//      space. With allow_special = false, special tokens are left out of the matching.
//   2. Each remaining piece goes through the pre-tokenizer: Split steps (a Regex or String
//      pattern, any behaviour, invert), Digits, then one ByteLevel step (add_prefix_space puts a
//      space before a piece that lacks one; use_regex applies GPT-2's pattern), which maps every
//      byte to its byte-level symbol (llmkv/byte_level.h). Invalid UTF-8 is no obstacle: such
//      bytes fall between the regex matches and are mapped like any other byte.
//   3. Each pre-token is merged by BPE: the adjacent pair with the lowest merge rank first, the
//      leftmost among equal ranks. With ignore_merges (Llama-3), a pre-token that is itself in the
//      vocab is one token. Results for pre-tokens up to 255 bytes are cached.
// decode(ids) concatenates the bytes of the tokens (token_bytes): decode(encode(s, false)) == s for
// every byte string s, valid UTF-8 or not (and decode(encode(s)) == s too when no added token has
// lstrip / rstrip), unless the ByteLevel step has add_prefix_space (adds_prefix_space()): then
// the spaces it put before pieces come back too, as in the reference. Unlike Hugging Face's decode, which replaces invalid UTF-8 by U+FFFD, decode
// returns the bytes as they are.
//
// Known differences from the reference, all in corner cases no shipped file relies on: a special
// token's match skipped under allow_special = false does not hide a shorter non-special added
// token inside it; a match that starts inside white space an rstrip token swallowed is not taken;
// the regex property tables are PCRE2's (U+180E counts as white space); added-token ids are read
// from the file and must agree with the vocab (the reference re-derives them from the content).
//
// What a file may hold (anything else is refused with a wm::Error naming the file and the field):
//   model: type "BPE", vocab, merges as "a b" strings or ["a", "b"] pairs, ignore_merges,
//          unk_token / fuse_unk (used only for a byte whose symbol is missing from the vocab),
//          dropout null or 0, byte_fallback false, continuing_subword_prefix and
//          end_of_word_suffix null or empty. "Unigram", "WordPiece", "WordLevel": not supported.
//   normalizer: null or NFC (also inside a Sequence). LIMITATION: NFC is not applied. Text goes
//          to the pre-tokenizer unchanged, which gives the ids of the reference implementation
//          exactly when the text is already in NFC (pure ASCII always is, and so is nearly all
//          text that keyboards, editors and the web produce) and may differ for text holding
//          decomposed sequences such as "e" + U+0301. normalizer_is_nfc() tells callers.
//   pre_tokenizer: ByteLevel; or a Sequence of Split / Digits steps ending in ByteLevel.
//   post_processor: null, ByteLevel (affects offsets only), TemplateProcessing (its "single"
//          template: the special tokens before and after the text, added by encode when
//          add_special is true), or a Sequence of those.
//   decoder: ByteLevel (alone or inside a Sequence).
//
// A Tokenizer is immutable once built; copies share it, and all const methods may run from
// several threads at once.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace wm::llm {

// An entry of "added_tokens": text matched in the raw input before pre-tokenization.
struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;      // skipped by decode(skip_special); not matched when allow_special is false
  bool single_word = false;  // only matched when not touching a word character on either side
  bool lstrip = false;       // swallows the white space before it
  bool rstrip = false;       // swallows the white space after it
  bool normalized = true;    // matched after normalization (here: in a second pass, see above)
};

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json. Throws wm::Error when the file cannot be read or holds a
  // feature that is not supported, wm::CorruptData when it is not valid JSON or is malformed (a
  // missing field, a merge naming a token that is not in the vocab, two tokens with one id, ...);
  // messages name the file.
  static Tokenizer load(const std::string& path);
  // As load, from a parsed document; `origin` names it in error messages.
  static Tokenizer from_json(const nlohmann::json& j, const std::string& origin);

  // Writes a tokenizer.json that this class and Hugging Face's tokenizers (0.20 or later: merges
  // are written as pairs) load back to the same tokenizer: the model (vocab ordered by id) and
  // added_tokens rebuilt, the other sections as they were read. Writes to a temporary name beside
  // `path`, then renames it over `path`. Throws wm::Error naming the path on a write failure.
  void save(const std::string& path) const;

  // The ids of `text` (any bytes). allow_special = false: the text of special added tokens is
  // encoded as plain text (non-special added tokens are still matched). add_special: puts the
  // post-processor's template tokens around the result (Llama-3: <|begin_of_text|> before).
  // Throws wm::Error when a byte has no symbol in the vocab and there is no unk_token (files of
  // GPT-2, Llama-3, Qwen2 and of BpeTrainer have all 256), or when PCRE2 gives up on a pattern.
  std::vector<int64_t> encode(std::string_view text, bool allow_special = true, bool add_special = false) const;

  // The bytes the ids stand for, concatenated; skip_special leaves out special added tokens.
  // Throws wm::Error when an id is negative, not below vocab_size(), or has no token.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  // The bytes token `id` decodes to: its byte-level symbols mapped back to bytes, or, for a token
  // with a character outside the 256 symbols (most added tokens: "<|im_end|>" is all symbols, but
  // a token holding a plain space is not), its text as it is. Throws as decode.
  std::string token_bytes(int64_t id) const;

  // The token's string as the file writes it (a byte-level string for vocab tokens, the content
  // for added tokens); nullopt when no token has this id.
  std::optional<std::string> id_to_token(int64_t id) const;
  // The id of a token string (added tokens first, then the vocab); nullopt when absent.
  std::optional<int64_t> token_to_id(const std::string& token) const;

  // One more than the largest id of the vocab and the added tokens.
  int64_t vocab_size() const;
  // True when `id` is an added token marked special (false for any other value, in range or not).
  bool is_special(int64_t id) const;

  const std::vector<AddedToken>& added_tokens() const;
  // The template tokens encode(add_special = true) puts before / after the text.
  const std::vector<int64_t>& template_prefix() const;
  const std::vector<int64_t>& template_suffix() const;
  // True when the file declares an NFC normalizer (which is not applied: see above).
  bool normalizer_is_nfc() const;
  // True when the ByteLevel pre-tokenizer step has add_prefix_space (the reference's default when
  // the field is absent): a piece of text that does not start with a space gets one.
  bool adds_prefix_space() const;
  // The number of merge rules, and where this tokenizer came from (a path or an origin).
  int64_t n_merges() const;
  const std::string& origin() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns ids produced one at a time (generation) into text one piece at a time: push returns the
// bytes that now form complete UTF-8 characters and holds back the start of a character that the
// next tokens may complete (at most 3 bytes). Bytes that can never become valid UTF-8 are passed
// on as they come, so the concatenation of all push results and flush equals decode(all ids).
// With `valid_utf8`, every piece is valid UTF-8 instead: bytes that can never become a character
// and an unfinished character at flush() come out as U+FFFD (utf8_valid), so a piece can go into
// JSON or onto a terminal as it is.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special = false, bool valid_utf8 = false);
  // The text completed by token `id` (possibly empty). Throws as Tokenizer::decode on a bad id,
  // leaving the held-back bytes as they were.
  std::string push(int64_t id);
  // The held-back bytes (an unfinished character, possibly empty); the decoder starts afresh.
  std::string flush();
  // How many bytes are held back.
  size_t pending() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  bool valid_utf8_;
  std::string pending_;
};

}  // namespace wm::llm
