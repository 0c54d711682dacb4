#include "llmkv/jinja_text.h"

namespace wm::llm::jinja::text {

CodePoint decode_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {b, 1};
  size_t len = 0;
  uint32_t cp = 0, min = 0;
  if ((b & 0xE0) == 0xC0) {
    len = 2, cp = b & 0x1F, min = 0x80;
  } else if ((b & 0xF0) == 0xE0) {
    len = 3, cp = b & 0x0F, min = 0x800;
  } else if ((b & 0xF8) == 0xF0) {
    len = 4, cp = b & 0x07, min = 0x10000;
  } else {
    return {b, 1};
  }
  if (i + len > s.size()) return {b, 1};
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return {b, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {b, 1};
  return {cp, len};
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); i += decode_at(s, i).len) out.push_back(i);
  out.push_back(s.size());
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += decode_at(s, i).len) ++n;
  return n;
}

bool is_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t space_prefix(std::string_view s, size_t from) {
  size_t i = from;
  while (i < s.size()) {
    const CodePoint c = decode_at(s, i);
    if (!is_space(c.cp) || (c.len == 1 && c.cp >= 0x80)) break;  // a stray byte is no space
    i += c.len;
  }
  return i - from;
}

size_t space_suffix_start(std::string_view s) {
  const std::vector<size_t> at = code_point_offsets(s);
  size_t k = at.size() - 1;
  while (k > 0) {
    const CodePoint c = decode_at(s, at[k - 1]);
    if (!is_space(c.cp) || (c.len == 1 && c.cp >= 0x80)) break;
    --k;
  }
  return at[k];
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  if (chars == nullptr) {
    const size_t b = left ? space_prefix(s) : 0;
    const size_t e = right ? b + space_suffix_start(s.substr(b)) : s.size();
    return std::string(s.substr(b, e - b));
  }
  std::vector<uint32_t> set;
  for (size_t i = 0; i < chars->size();) {
    const CodePoint c = decode_at(*chars, i);
    set.push_back(c.cp);
    i += c.len;
  }
  auto in_set = [&](uint32_t cp) {
    for (uint32_t x : set)
      if (x == cp) return true;
    return false;
  };
  const std::vector<size_t> at = code_point_offsets(s);
  size_t b = 0, e = at.size() - 1;
  if (left)
    while (b < e && in_set(decode_at(s, at[b]).cp)) ++b;
  if (right)
    while (e > b && in_set(decode_at(s, at[e - 1]).cp)) --e;
  return std::string(s.substr(at[b], at[e] - at[b]));
}

std::vector<std::string> split_lines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    const CodePoint c = decode_at(s, i);
    const bool stray = c.len == 1 && c.cp >= 0x80;
    const bool br = !stray && (c.cp == '\n' || c.cp == '\r' || c.cp == 0x0B || c.cp == 0x0C ||
                               (c.cp >= 0x1C && c.cp <= 0x1E) || c.cp == 0x85 || c.cp == 0x2028 || c.cp == 0x2029);
    if (!br) {
      i += c.len;
      continue;
    }
    size_t end = i + c.len;
    if (c.cp == '\r' && end < s.size() && s[end] == '\n') ++end;
    out.emplace_back(s.substr(start, (keepends ? end : i) - start));
    start = i = end;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

namespace casemap {

// One code point's upper (or lower) case as a code point, or 0 when it has none here (then the
// caller keeps it); the multi-code-point results are handled by the callers.
uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
    return (c & 1) ? c - 1 : 0;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? 0 : c - 1;
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return 0;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
    return (c & 1) ? 0 : c + 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : 0;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return 0;
}

bool is_cased(uint32_t c) {
  return to_upper(c) != 0 || to_lower(c) != 0 || c == 0xDF || c == 0x130 || c == 0x149 || c == 0x138;
}

void append_upper(std::string& out, uint32_t c) {
  if (c == 0xDF) {
    out += "SS";
  } else if (c == 0x149) {
    append_utf8(out, 0x2BC);
    out += 'N';
  } else {
    const uint32_t u = to_upper(c);
    append_utf8(out, u != 0 ? u : c);
  }
}

// Python lowers a capital sigma to the final form when a cased letter precedes it and none follows.
void append_lower(std::string& out, std::string_view s, const std::vector<size_t>& at, size_t k) {
  const uint32_t c = decode_at(s, at[k]).cp;
  if (c == 0x130) {
    out += 'i';
    append_utf8(out, 0x307);
  } else if (c == 0x3A3) {
    const bool before = k > 0 && is_cased(decode_at(s, at[k - 1]).cp);
    const bool after = k + 2 < at.size() && is_cased(decode_at(s, at[k + 1]).cp);
    append_utf8(out, before && !after ? 0x3C2 : 0x3C3);
  } else {
    const uint32_t l = to_lower(c);
    append_utf8(out, l != 0 ? l : c);
  }
}

// Appends s[at[k]..at[k+1]) unchanged (keeps a stray byte as it is).
void append_same(std::string& out, std::string_view s, const std::vector<size_t>& at, size_t k) {
  out.append(s.substr(at[k], at[k + 1] - at[k]));
}

}  // namespace casemap

std::string upper(std::string_view s) {
  const std::vector<size_t> at = code_point_offsets(s);
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k + 1 < at.size(); ++k) {
    const CodePoint c = decode_at(s, at[k]);
    if (c.len == 1 && c.cp >= 0x80)
      casemap::append_same(out, s, at, k);
    else
      casemap::append_upper(out, c.cp);
  }
  return out;
}

std::string lower(std::string_view s) {
  const std::vector<size_t> at = code_point_offsets(s);
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k + 1 < at.size(); ++k) {
    const CodePoint c = decode_at(s, at[k]);
    if (c.len == 1 && c.cp >= 0x80)
      casemap::append_same(out, s, at, k);
    else
      casemap::append_lower(out, s, at, k);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  if (s.empty()) return {};
  const CodePoint first = decode_at(s, 0);
  std::string out;
  if (first.len == 1 && first.cp >= 0x80)
    out += s[0];
  else
    casemap::append_upper(out, first.cp);
  return out + lower(s.substr(first.len));
}

namespace casemap {
// Whether s has a cased letter and every cased letter is of the asked case.
bool all_cased_are(std::string_view s, bool want_lower) {
  bool any = false;
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = decode_at(s, i);
    i += c.len;
    if (c.len == 1 && c.cp >= 0x80) continue;
    const bool is_low = to_upper(c.cp) != 0 || c.cp == 0xDF || c.cp == 0x149 || c.cp == 0x138;
    const bool is_up = to_lower(c.cp) != 0 || c.cp == 0x130;
    if (!is_low && !is_up) continue;
    any = true;
    if (want_lower ? is_up : is_low) return false;
  }
  return any;
}
}  // namespace casemap

bool is_lower(std::string_view s) { return casemap::all_cased_are(s, true); }
bool is_upper(std::string_view s) { return casemap::all_cased_are(s, false); }

}  // namespace wm::llm::jinja::text
