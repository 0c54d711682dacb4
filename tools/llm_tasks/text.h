#pragma once
// Shared pieces of the generators: token accounting, word lists, pseudo-words, and the filler
// grammar. Internal to wm_llm_tasks (namespace detail), but stable enough for tests.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tools/llm_tasks/rng.h"
#include "tools/llm_tasks/sample.h"

namespace wm::llmtasks::detail {

// options.count, or bytes_counter(4) when it is empty.
TokenCounter counter_of(const GenOptions& options);

// Validates the options every generator shares (target_tokens >= 64); throws wm::Error.
void check_common(const GenOptions& options, const char* task);

// The stopping rule of every fill loop: true when adding a piece of `next` tokens to a running
// `total` brings the total closer to `target` than stopping (ties add). False once total >= target.
inline bool closer_with(int64_t total, int64_t next, int64_t target) {
  if (total >= target) return false;
  return total + next - target <= target - total;
}

// Appends a segment and returns its token count (counted once, here).
int64_t add_segment(Sample& s, const TokenCounter& count, std::string id, std::string kind,
                    std::string text, bool target = false);

// Appends a segment whose token count the caller already has.
void push_segment(Sample& s, std::string id, std::string kind, std::string text, bool target = false);

// "Abc" from "abc".
std::string capitalize(std::string s);
// Decimal digits of a number in [lo, hi] not in `used`; inserts it. Throws when the range is full.
std::string fresh_number(Rng& rng, int lo, int hi, std::set<std::string>& used);

// The 70 consonant-vowel syllables of pseudo-words ("ba", "be", ..., "zu"), consonant-major.
const std::vector<std::string>& syllables();
// A pronounceable pseudo-word of consonant-vowel syllables ("zuvo", "pelika"), 2..3 syllables.
std::string pseudo_word(Rng& rng);
// n distinct pseudo-words not in `avoid`.
std::vector<std::string> distinct_pseudo_words(Rng& rng, size_t n, const std::set<std::string>& avoid = {});

// Word lists (fixed, shared by the tasks).
const std::vector<std::string>& colours();      // red, blue, ...
const std::vector<std::string>& needle_things();  // lantern, kettle, ... (niah subjects)
const std::vector<std::string>& person_names();   // Anna, Bruno, ...
const std::vector<std::string>& pet_names();      // Biscuit, Pepper, ...

// One sentence of the filler grammar: varied, procedural, never containing "secret code" and
// never containing a string of `avoid` (regenerated until it does not).
std::string filler_sentence(Rng& rng, const std::vector<std::string>& avoid);

// A filler sentence with its separator: text ends with " " inside a paragraph and with "\n" at a
// paragraph's end.
struct FillerUnit {
  std::string text;
  int64_t tokens = 0;
  bool paragraph_end = false;
};
// Filler sentences whose summed cost is closest to `budget` (closer_with), in paragraphs of 2..6
// sentences; the last unit ends a paragraph. Empty when budget <= 0.
std::vector<FillerUnit> make_filler(Rng& rng, const TokenCounter& count, int64_t budget,
                                    const std::vector<std::string>& avoid);
// Appends units [begin, end) as segments "filler:<n>" (n counting up from *next_id), one per
// paragraph, split where a paragraph crosses `end`. Returns the tokens added.
int64_t add_filler_segments(Sample& s, const TokenCounter& count, const std::vector<FillerUnit>& units,
                            size_t begin, size_t end, int* next_id);

}  // namespace wm::llmtasks::detail
