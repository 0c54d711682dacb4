#pragma once
// The regular expressions that cut text into pre-tokens before byte-level BPE, on PCRE2.
//
// Patterns are compiled with UTF and UCP (so \s, \p{L}, \p{N} follow Unicode), JIT-compiled when
// the platform has a JIT, and with PCRE2_MATCH_INVALID_UTF: invalid UTF-8 in the subject never
// matches any pattern item but never stops the search either, so such bytes end up in the gaps
// between matches. Hugging Face tokenizer files write their patterns for Oniguruma; the patterns
// of GPT-2, Llama-3 and Qwen2 mean the same in PCRE2, up to the Unicode version of the property
// tables (PCRE2 here: Unicode 14 or later).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wm::llm {

// GPT-2's pattern, the one a ByteLevel pre-tokenizer with use_regex = true applies.
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2's pattern: case-insensitive contractions, digits one by one.
inline constexpr const char* kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama-3's pattern: as Qwen2's, with digits in runs of up to three.
inline constexpr const char* kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A compiled pattern. Copies share the compiled code; find_all may run from several threads at
// once.
class SplitRegex {
 public:
  // Compiles `pattern`, as a regular expression or, when `literal`, as a plain string to find.
  // Throws wm::Error naming the pattern, the offset in it and PCRE2's message when it does not
  // compile (an empty literal is refused too).
  explicit SplitRegex(const std::string& pattern, bool literal = false);

  const std::string& pattern() const { return pattern_; }
  bool literal() const { return literal_; }

  // Appends to `out` the byte ranges [begin, end) of the successive non-overlapping matches in s,
  // leftmost first. Empty matches are left out. Throws wm::Error when PCRE2 gives up (a match or
  // heap limit, which the shipped patterns do not reach).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  // True when the pattern matches s starting exactly at byte `offset` (an anchored match).
  bool matches_at(std::string_view s, size_t offset) const;

 private:
  struct Code;
  std::string pattern_;
  bool literal_ = false;
  std::shared_ptr<const Code> code_;
};

// How the matches of a Split pre-tokenizer become pieces (the names of Hugging Face's
// SplitDelimiterBehavior).
enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

// Cuts s into pieces by the matches of `re` under `behavior`: Isolated keeps matches and the gaps
// between them as separate pieces; Removed drops the matches; MergedWithPrevious/Next glue each
// match to the piece before/after it; Contiguous joins runs of adjacent matches (and of adjacent
// gaps). With `invert`, the gaps play the part of the matches. Pieces are views into s, in order,
// none empty; without Removed they cover s exactly.
void split_pieces(const SplitRegex& re, SplitBehavior behavior, bool invert, std::string_view s,
                  std::vector<std::string_view>& out);

}  // namespace wm::llm
