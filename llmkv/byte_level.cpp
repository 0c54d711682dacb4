#include "llmkv/byte_level.h"

#include <array>

#include "runtime/utf8.h"

namespace wm::llm {
namespace {

struct ByteTable {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // indexed by code point; every symbol is below U+0144

  ByteTable() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_unicode[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// The byte length of a well-formed sequence led by c (0 when c cannot lead one), and the range
// its second byte must fall in.
int lead_length(unsigned char c, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) {
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return table().to_unicode[b]; }

std::optional<uint8_t> unicode_to_byte(char32_t c) {
  if (c >= table().to_byte.size() || table().to_byte[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(table().to_byte[c]);
}

std::string utf8_encode(char32_t c) {
  std::string out;
  append_utf8(out, static_cast<uint32_t>(c));
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  static const std::array<std::string, 256> symbols = [] {
    std::array<std::string, 256> s;
    for (int b = 0; b < 256; ++b) s[b] = utf8_encode(byte_to_unicode(static_cast<uint8_t>(b)));
    return s;
  }();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += symbols[c];
  return out;
}

std::optional<char32_t> utf8_decode_at(std::string_view s, size_t i, size_t& len) {
  len = 1;
  const auto c = static_cast<unsigned char>(s[i]);
  unsigned char lo, hi;
  const int n = lead_length(c, lo, hi);
  if (n == 0 || i + n > s.size()) return std::nullopt;
  if (n == 1) return static_cast<char32_t>(c);
  const auto c1 = static_cast<unsigned char>(s[i + 1]);
  if (c1 < lo || c1 > hi) return std::nullopt;
  char32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto ck = static_cast<unsigned char>(s[i + k]);
    if (!is_cont(ck)) return std::nullopt;
    cp = (cp << 6) | (ck & 0x3F);
  }
  len = static_cast<size_t>(n);
  return cp;
}

std::optional<std::string> byte_level_to_bytes(std::string_view symbols) {
  std::string out;
  out.reserve(symbols.size());
  size_t i = 0;
  while (i < symbols.size()) {
    size_t len;
    const auto cp = utf8_decode_at(symbols, i, len);
    if (!cp) return std::nullopt;
    const auto b = unicode_to_byte(*cp);
    if (!b) return std::nullopt;
    out += static_cast<char>(*b);
    i += len;
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const size_t j = n - k;
    const auto c = static_cast<unsigned char>(s[j]);
    if (is_cont(c)) continue;
    unsigned char lo, hi;
    const int len = lead_length(c, lo, hi);
    if (len <= static_cast<int>(k)) return n;  // complete, ASCII, or a byte that cannot lead
    if (k >= 2) {
      const auto c1 = static_cast<unsigned char>(s[j + 1]);
      if (c1 < lo || c1 > hi) return n;  // broken: can never complete
    }
    return j;  // a valid start of a sequence that needs more bytes
  }
  return n;
}

std::string utf8_valid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (utf8_decode_at(s, i, len)) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    // An ill-formed sequence: its maximal subpart (the lead and the continuation bytes that fit
    // it) becomes one U+FFFD, as Python's errors="replace" and the Unicode standard's practice do.
    unsigned char lo, hi;
    const int n = lead_length(static_cast<unsigned char>(s[i]), lo, hi);
    size_t j = i + 1;
    if (n >= 2 && j < s.size() && static_cast<unsigned char>(s[j]) >= lo && static_cast<unsigned char>(s[j]) <= hi) {
      ++j;
      while (j < i + static_cast<size_t>(n) && j < s.size() && is_cont(static_cast<unsigned char>(s[j]))) ++j;
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

}  // namespace wm::llm
