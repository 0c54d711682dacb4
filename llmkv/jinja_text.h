#pragma once
// Text as Python's str sees it, for the Jinja interpreter (llmkv/jinja.h): strings are UTF-8 bytes,
// but lengths, indexes, slices and case work on code points, and "whitespace" is str.isspace()'s
// set (Unicode spaces included, as str.strip() and the \s of Jinja's lexer use it). A byte that is
// not part of valid UTF-8 counts as one code point of its own and is left as it is.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/utf8.h"

namespace wm::llm::jinja::text {

// The code point starting at s[i] and its length in bytes (1 for a byte that starts no valid
// UTF-8 sequence, whose value is then the byte itself). i < s.size().
struct CodePoint {
  uint32_t cp;
  size_t len;
};
CodePoint decode_at(std::string_view s, size_t i);

// Appends cp as UTF-8 (cp <= 0x10FFFF): runtime/utf8.h.
using wm::append_utf8;

// Byte offsets where each code point of s starts, plus s.size() at the end ([n + 1] entries).
std::vector<size_t> code_point_offsets(std::string_view s);
size_t code_point_count(std::string_view s);

// Python's str.isspace() for one code point.
bool is_space(uint32_t cp);
// The number of bytes of whitespace at the start of s[from..] / the end of s[..to].
size_t space_prefix(std::string_view s, size_t from = 0);
size_t space_suffix_start(std::string_view s);  // the offset where the trailing whitespace begins

// str.strip() / lstrip() / rstrip(): with no chars (nullptr), whitespace; else any code point of *chars.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

// str.splitlines(keepends): lines ended by \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029.
std::vector<std::string> split_lines(std::string_view s, bool keepends);

// str.upper() / str.lower() / str.capitalize(). The case maps cover ASCII, Latin-1, Latin
// Extended-A, the basic Greek and Cyrillic letters, with Python's results for the special cases
// there (ß -> SS, İ -> i̇, ŉ -> ʼN, µ -> Μ, ſ -> S, final σ -> ς); other code points keep their case.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);
// str.islower() / str.isupper() on the same tables: some cased letter, none of the other case.
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

}  // namespace wm::llm::jinja::text
