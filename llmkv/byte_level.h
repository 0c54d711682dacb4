#pragma once
// The byte-level alphabet of byte-level BPE (GPT-2's bytes_to_unicode): every byte 0..255 stands
// for one printable code point, so that any byte string, valid UTF-8 or not, is a string of
// vocabulary symbols. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other
// 68 bytes (0x00..0x20, 0x7F..0xA0, 0xAD), in increasing order, stand for U+0100, U+0101, ...
// (so ' ' is U+0120 'Ġ' and '\n' is U+010A 'Ċ').
//
// Also the few UTF-8 helpers the tokenizer and its stream decoder need.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace wm::llm {

// The code point that byte b stands for.
char32_t byte_to_unicode(uint8_t b);

// The byte that code point c stands for; nullopt when c is not one of the 256 symbols.
std::optional<uint8_t> unicode_to_byte(char32_t c);

// Maps every byte of `bytes` to its symbol, as UTF-8 (1 or 2 bytes per input byte). Never throws.
std::string bytes_to_byte_level(std::string_view bytes);

// The inverse of bytes_to_byte_level: nullopt when `symbols` is not valid UTF-8 or holds a code
// point outside the 256 symbols.
std::optional<std::string> byte_level_to_bytes(std::string_view symbols);

// UTF-8 of one code point (c <= 0x10FFFF; surrogates are encoded as is).
std::string utf8_encode(char32_t c);

// Decodes the code point starting at s[i] when s[i..] begins with a well-formed UTF-8 sequence:
// returns it and sets `len` to its byte length; otherwise returns nullopt and sets `len` to 1.
std::optional<char32_t> utf8_decode_at(std::string_view s, size_t i, size_t& len);

// The length of the longest prefix of s that does not end inside a UTF-8 sequence that more bytes
// could still complete. Bytes that can never become valid UTF-8 (a stray continuation byte, 0xFF,
// an overlong lead, a sequence broken before its end) count as complete, so a caller that emits
// the prefix and holds back the rest never holds back more than 3 bytes.
size_t utf8_complete_prefix(std::string_view s);

// `s` as valid UTF-8: each ill-formed sequence (a stray continuation byte, 0xFF, an overlong or
// surrogate sequence, a character cut short) is replaced by U+FFFD, one per maximal subpart.
// Valid input comes back unchanged. Never throws.
std::string utf8_valid(std::string_view s);

}  // namespace wm::llm
