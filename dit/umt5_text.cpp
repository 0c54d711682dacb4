#include "dit/umt5_text.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "runtime/error.h"

namespace wm::dit {
namespace {

#include "dit/umt5_html_entities.inc"

// ---- UTF-8 ----------------------------------------------------------------------------------

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = 0;
    char32_t c = 0;
    if (b < 0x80) {
      c = b;
    } else if ((b & 0xE0) == 0xC0) {
      n = 1, c = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 2, c = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 3, c = b & 0x07;
    } else {
      throw Error(str_cat("umt5_clean_whitespace: not valid UTF-8 at byte ", i));
    }
    if (i + static_cast<size_t>(n) >= s.size() && n > 0)
      throw Error(str_cat("umt5_clean_whitespace: truncated UTF-8 sequence at byte ", i));
    for (int k = 1; k <= n; ++k) {
      const auto cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xC0) != 0x80) throw Error(str_cat("umt5_clean_whitespace: not valid UTF-8 at byte ", i));
      c = (c << 6) | (cb & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (c < kMin[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      throw Error(str_cat("umt5_clean_whitespace: not valid UTF-8 (overlong, surrogate or past U+10FFFF) at byte ", i));
    out.push_back(c);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// ---- character classes ----------------------------------------------------------------------

// The White_Space property: what `\s` of the regex module matches in a str pattern.
bool is_unicode_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.isspace (what str.strip removes): White_Space plus the separators U+001C-U+001F.
bool is_python_space(char32_t c) { return is_unicode_space(c) || (c >= 0x1C && c <= 0x1F); }

bool is_ascii_alnum(char32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Windows-1252 as ftfy's "sloppy" codec and Python's html module read 0x80-0x9F (the five bytes
// Windows-1252 leaves undefined stay as they are).
char32_t windows1252_c1(char32_t c) {
  static constexpr char32_t kMap[32] = {
      0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
      0x2039, 0x0152, 0x008D, 0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
      0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178};
  return kMap[c - 0x80];
}

// ---- html.unescape ----------------------------------------------------------------------------

using EntityMap = std::map<std::u32string, std::u32string>;

EntityMap* make_entity_map(const HtmlEntity* begin, const HtmlEntity* end) {
  auto* t = new EntityMap;
  for (const HtmlEntity* e = begin; e != end; ++e)
    (*t)[std::u32string(e->name, e->name + std::char_traits<char>::length(e->name))] = e->value;
  return t;
}

// html.entities.html5: names as its keys (with ';', and the legacy ones also without).
const EntityMap& html5_entities() {
  static const EntityMap* t = make_entity_map(std::begin(kHtml5Entities), std::end(kHtml5Entities));
  return *t;
}

// The all-caps names (with ';') that ftfy decodes besides html5's.
const EntityMap& ftfy_upper_entities() {
  static const EntityMap* t = make_entity_map(std::begin(kFtfyUpperEntities), std::end(kFtfyUpperEntities));
  return *t;
}

// Python's html._replace_charref for a numeric reference of value `num` (saturated past U+10FFFF).
std::u32string numeric_reference(uint64_t num) {
  if (num == 0) return U"\uFFFD";
  if (num == 0x0D) return U"\r";
  if (num >= 0x80 && num <= 0x9F) return std::u32string(1, windows1252_c1(static_cast<char32_t>(num)));
  if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return U"\uFFFD";
  const bool invalid = (num >= 0x1 && num <= 0x8) || (num >= 0xE && num <= 0x1F) || (num >= 0x7F && num <= 0x9F) ||
                       (num >= 0xFDD0 && num <= 0xFDEF) || num == 0xB || (num & 0xFFFE) == 0xFFFE;
  if (invalid) return U"";
  return std::u32string(1, static_cast<char32_t>(num));
}

// At s[i] == '&': Python's `#[0-9]+;?` or `#[xX][0-9a-fA-F]+;?`. Sets `end` past the match and
// appends the replacement; false when neither matches.
bool match_numeric(const std::u32string& s, size_t i, size_t& end, std::u32string& out) {
  if (i + 1 >= s.size() || s[i + 1] != U'#') return false;
  size_t j = i + 2;
  const bool hex = j < s.size() && (s[j] == U'x' || s[j] == U'X');
  if (hex) ++j;
  const size_t digits_begin = j;
  uint64_t num = 0;
  auto digit = [hex](char32_t c) -> int {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (hex && c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (hex && c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  };
  for (; j < s.size() && digit(s[j]) >= 0; ++j) num = std::min<uint64_t>(num * (hex ? 16 : 10) + digit(s[j]), 0x110000);
  if (j == digits_begin) return false;
  if (j < s.size() && s[j] == U';') ++j;
  end = j;
  out += numeric_reference(num);
  return true;
}

// At s[i] == '&' (not a numeric reference): Python's `[^\t\n\f <&#;]{1,32};?` and its lookup
// (the name as written, else the longest legacy name it starts with).
bool match_named(const std::u32string& s, size_t i, size_t& end, std::u32string& out) {
  size_t j = i + 1;
  auto name_char = [](char32_t c) { return !(c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' || c == '#' || c == ';'); };
  while (j < s.size() && j - (i + 1) < 32 && name_char(s[j])) ++j;
  if (j == i + 1) return false;
  const bool semicolon = j < s.size() && s[j] == U';';
  end = semicolon ? j + 1 : j;
  const std::u32string whole = s.substr(i + 1, end - (i + 1));
  const EntityMap& table = html5_entities();
  auto it = table.find(whole);
  if (it != table.end()) {
    out += it->second;
    return true;
  }
  // The longest prefix of at least 2 characters that is a key (only legacy names lack the ';').
  for (size_t x = whole.size() - 1; x > 1; --x) {
    auto p = table.find(whole.substr(0, x));
    if (p != table.end()) {
      out += p->second;
      out += whole.substr(x);
      return true;
    }
  }
  out += U"&" + whole;
  return true;
}

std::u32string html_unescape(const std::u32string& s) {
  if (s.find(U'&') == std::u32string::npos) return s;
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != U'&') {
      out.push_back(s[i++]);
      continue;
    }
    size_t end = i;
    if (match_numeric(s, i, end, out) || (s.size() > i + 1 && s[i + 1] != U'#' && match_named(s, i, end, out))) {
      i = end;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// ---- ftfy.fix_text's fixers --------------------------------------------------------------------

// ftfy.fixes.unescape_html: `&#?[0-9A-Za-z]{1,24};` replaced when it is an html5 name with ';' or
// one of ftfy's all-caps names, or a numeric reference that html.unescape decodes whole.
std::u32string ftfy_unescape_html(const std::u32string& s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i + 1;
    if (s[i] == U'&') {
      if (j < s.size() && s[j] == U'#') ++j;
      const size_t name_begin = j;
      while (j < s.size() && j - name_begin < 24 && is_ascii_alnum(s[j])) ++j;
      if (j > name_begin && j < s.size() && s[j] == U';') {
        const std::u32string match = s.substr(i, j + 1 - i);
        std::u32string rep = match;
        const std::u32string key = s.substr(name_begin, j + 1 - name_begin);  // the name and ';'
        const EntityMap &html5 = html5_entities(), &upper = ftfy_upper_entities();
        auto it = html5.find(key);
        auto up = upper.find(key);
        if (name_begin == i + 1 && it != html5.end()) {
          rep = it->second;
        } else if (name_begin == i + 1 && up != upper.end()) {
          rep = up->second;
        } else if (name_begin == i + 2) {
          const std::u32string u = html_unescape(match);
          if (u.find(U';') == std::u32string::npos) rep = u;
        }
        out += rep;
        i = j + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// ftfy's LIGATURES table (Dutch, Afrikaans, Serbo-Croatian digraphs; Latin typographic ligatures).
const std::u32string* ligature(char32_t c) {
  static const std::map<char32_t, std::u32string> kLigatures = {
      {0x0132, U"IJ"}, {0x0133, U"ij"}, {0x0149, U"\u02BCn"}, {0x01F1, U"DZ"}, {0x01F2, U"Dz"},
      {0x01F3, U"dz"}, {0x01C4, U"D\u017D"}, {0x01C5, U"D\u017E"}, {0x01C6, U"d\u017E"}, {0x01C7, U"LJ"},
      {0x01C8, U"Lj"}, {0x01C9, U"lj"}, {0x01CA, U"NJ"}, {0x01CB, U"Nj"}, {0x01CC, U"nj"},
      {0xFB00, U"ff"}, {0xFB01, U"fi"}, {0xFB02, U"fl"}, {0xFB03, U"ffi"}, {0xFB04, U"ffl"},
      {0xFB05, U"\u017Ft"}, {0xFB06, U"st"}};
  auto it = kLigatures.find(c);
  return it == kLigatures.end() ? nullptr : &it->second;
}

// ftfy's remove_control_chars set.
bool is_ftfy_control(char32_t c) {
  return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
         c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

// fix_c1_controls, fix_latin_ligatures, fix_character_width (ASCII forms and U+3000 only),
// uncurl_quotes: the per-character fixers, in ftfy's order (each reads the previous one's output).
std::u32string ftfy_char_fixes(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0x80 && c <= 0x9F) c = windows1252_c1(c);
    std::u32string piece;
    if (const std::u32string* lig = ligature(c)) piece = *lig;
    else piece = std::u32string(1, c);
    for (char32_t& p : piece) {
      if (p >= 0xFF01 && p <= 0xFF5E) p = p - 0xFF01 + 0x21;
      else if (p == 0x3000) p = U' ';
      if (p == 0x02BC || (p >= 0x2018 && p <= 0x201B)) p = U'\'';
      else if (p >= 0x201C && p <= 0x201F) p = U'"';
    }
    out += piece;
  }
  return out;
}

// remove_terminal_escapes (`\x1b\[(\d|;)*[a-zA-Z]`, ASCII digits), then remove_control_chars.
std::u32string ftfy_strip_escapes_and_controls(const std::u32string& s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == 0x1B && i + 1 < s.size() && s[i + 1] == U'[') {
      size_t j = i + 2;
      while (j < s.size() && ((s[j] >= '0' && s[j] <= '9') || s[j] == ';')) ++j;
      if (j < s.size() && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z'))) {
        i = j + 1;
        continue;
      }
    }
    if (!is_ftfy_control(s[i])) out.push_back(s[i]);
    ++i;
  }
  return out;
}

// ftfy.fix_and_explain on one segment, to its fixed point. fix_line_breaks is left out: it only
// turns line breaks into '\n', which whitespace_clean makes a space either way, and U+0085 has
// become U+2026 by then (fix_c1_controls runs first).
std::u32string ftfy_fix_segment(std::u32string s, bool unescape_html) {
  while (true) {
    const std::u32string orig = s;
    if (unescape_html) s = ftfy_unescape_html(s);
    s = ftfy_strip_escapes_and_controls(ftfy_char_fixes(s));
    if (s == orig) return s;
  }
}

// ftfy.fix_text: segments end after each '\n'; HTML unescaping stops for good at the first
// segment holding '<'.
std::u32string ftfy_fix_text(const std::u32string& s) {
  std::u32string out;
  bool unescape_html = true;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t brk = s.find(U'\n', pos);
    brk = brk == std::u32string::npos ? s.size() : brk + 1;
    const std::u32string seg = s.substr(pos, brk - pos);
    if (unescape_html && seg.find(U'<') != std::u32string::npos) unescape_html = false;
    out += ftfy_fix_segment(seg, unescape_html);
    pos = brk;
  }
  return out;
}

std::u32string python_strip(const std::u32string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_python_space(s[b])) ++b;
  while (e > b && is_python_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// re.sub(r'\s+', ' ', s).strip()
std::u32string collapse_whitespace(const std::u32string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    if (!is_unicode_space(s[i])) {
      out.push_back(s[i++]);
      continue;
    }
    while (i < s.size() && is_unicode_space(s[i])) ++i;
    out.push_back(U' ');
  }
  return python_strip(out);
}

}  // namespace

std::string umt5_clean_whitespace(const std::string& utf8) {
  std::u32string s = ftfy_fix_text(utf8_decode(utf8));
  s = python_strip(html_unescape(html_unescape(s)));
  return utf8_encode(collapse_whitespace(s));
}

std::string python_html_unescape(const std::string& utf8) { return utf8_encode(html_unescape(utf8_decode(utf8))); }

}  // namespace wm::dit
