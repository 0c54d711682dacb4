#include "llmkv/jinja_lexer.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "llmkv/jinja_text.h"

namespace wm::llm::jinja {

std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace lexer_impl {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body after "backslashreplace", as
// Jinja reads string literals: \n \t \\ \' \" \a \b \f \r \v, \ooo, \xhh, \uhhhh, \Uhhhhhhhh,
// a backslash before a newline joins lines, any other backslash stays.
class Unescaper {
 public:
  Unescaper(const std::string& raw, size_t pos) : raw_(raw), pos_(pos) {}

  std::string run() {
    for (size_t i = 0; i < raw_.size();) {
      if (raw_[i] != '\\') {
        out_ += raw_[i++];
        continue;
      }
      i = escape(i + 1);
    }
    return out_;
  }

 private:
  const std::string& raw_;
  size_t pos_;
  std::string out_;

  // Decodes the escape whose character is at raw_[i]; returns the index after it.
  size_t escape(size_t i) {
    const char d = raw_[i];
    if (static_cast<unsigned char>(d) >= 0x80) return non_ascii(i);
    static const char* const kSimple = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
    for (const char* p = kSimple; *p != 0; p += 2)
      if (*p == d) {
        out_ += p[1];
        return i + 1;
      }
    if (d == '\n') return i + 1;
    if (d >= '0' && d <= '7') {
      uint32_t v = 0;
      size_t k = i;
      while (k < raw_.size() && k < i + 3 && raw_[k] >= '0' && raw_[k] <= '7') v = v * 8 + (raw_[k++] - '0');
      text::append_utf8(out_, v);
      return k;
    }
    if (d == 'x' || d == 'u' || d == 'U') return hex(i, d == 'x' ? 2 : d == 'u' ? 4 : 8);
    if (d == 'N') throw SyntaxFailure{pos_, "\\N{...} escapes in string literals are not supported"};
    out_ += '\\';
    return i;  // the character after the backslash is copied as it is
  }

  size_t hex(size_t i, int digits) {
    uint32_t v = 0;
    for (int k = 1; k <= digits; ++k) {
      const int h = i + k < raw_.size() ? hex_value(raw_[i + k]) : -1;
      if (h < 0)
        throw SyntaxFailure{pos_, std::string("truncated \\") + raw_[i] + std::string(digits, 'X') + " escape"};
      v = v * 16 + static_cast<uint32_t>(h);
    }
    if (v > 0x10FFFF) throw SyntaxFailure{pos_, "illegal Unicode character in a \\U escape"};
    if (v >= 0xD800 && v <= 0xDFFF) throw SyntaxFailure{pos_, "a surrogate code point cannot be written as UTF-8"};
    text::append_utf8(out_, v);
    return i + 1 + static_cast<size_t>(digits);
  }

  // A backslash before a non-ASCII character: "backslashreplace" has turned the character into
  // \xhh, \uhhhh or \Uhhhhhhhh, whose backslash this one escapes: a backslash and the rest stay text.
  size_t non_ascii(size_t i) {
    const text::CodePoint c = text::decode_at(raw_, i);
    char buf[16];
    if (c.cp < 0x100)
      std::snprintf(buf, sizeof buf, "\\x%02x", c.cp);
    else if (c.cp < 0x10000)
      std::snprintf(buf, sizeof buf, "\\u%04x", c.cp);
    else
      std::snprintf(buf, sizeof buf, "\\U%08x", c.cp);
    out_ += buf;
    return i + c.len;
  }
};

class Lexer {
 public:
  explicit Lexer(const std::string& s) : s_(s), n_(s.size()) {}

  std::vector<Token> run() {
    while (pos_ < n_) root_step();
    out_.push_back(Token{Tok::End, n_, {}});
    return std::move(out_);
  }

 private:
  const std::string& s_;
  const size_t n_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> out_;
  std::string balance_;  // the closing brackets awaited inside a tag

  bool at(size_t i, const char* lit) const { return s_.compare(i, std::strlen(lit), lit) == 0; }
  size_t skip_spaces(size_t i) const { return i + text::space_prefix(s_, i); }

  void emit(Tok t, size_t pos, std::string text = {}) { out_.push_back(Token{t, pos, std::move(text)}); }

  // Data up to the next tag, stripped as the tag's sign and lstrip_blocks ask; then the tag.
  void root_step() {
    size_t tag = pos_;
    while ((tag = s_.find('{', tag)) != std::string::npos &&
           (tag + 1 >= n_ || std::strchr("{%#", s_[tag + 1]) == nullptr || s_[tag + 1] == 0))
      ++tag;
    if (tag == std::string::npos) {
      emit(Tok::Data, pos_, s_.substr(pos_));
      pos_ = n_;
      return;
    }
    const char kind = s_[tag + 1];
    size_t after = tag + 2;
    char sign = after < n_ && (s_[after] == '-' || s_[after] == '+') ? s_[after] : 0;
    char raw_sign = 0;
    const size_t raw_end = kind == '%' ? raw_begin_end(tag, &raw_sign) : std::string::npos;
    if (raw_end != std::string::npos) sign = raw_sign;
    std::string data = s_.substr(pos_, tag - pos_);
    strip_before(data, sign, kind != '{');
    if (!data.empty()) emit(Tok::Data, pos_, std::move(data));
    if (raw_end != std::string::npos) {
      pos_ = raw_end;
      line_starting_ = s_[raw_end - 1] == '\n';
      raw_body(tag);
      return;
    }
    line_starting_ = false;
    pos_ = after + (sign != 0 ? 1 : 0);
    if (kind == '#') {
      comment(tag);
    } else {
      emit(kind == '%' ? Tok::BlockBegin : Tok::VarBegin, tag);
      in_tag(kind == '%', tag);
    }
  }

  void strip_before(std::string& data, char sign, bool lstrip_allowed) const {
    if (sign == '-') {
      data.resize(text::space_suffix_start(data));
    } else if (sign != '+' && lstrip_allowed) {
      const size_t nl = data.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < data.size() &&
          text::space_prefix(data, l_pos) == data.size() - l_pos)
        data.resize(l_pos);
    }
  }

  // The end of "{%[-+] raw [-]%}" starting at tag, or npos.
  size_t raw_begin_end(size_t tag, char* sign) const {
    size_t i = tag + 2;
    *sign = 0;
    if (i < n_ && (s_[i] == '-' || s_[i] == '+')) *sign = s_[i++];
    i = skip_spaces(i);
    if (!at(i, "raw")) return std::string::npos;
    i = skip_spaces(i + 3);
    if (at(i, "-%}")) return skip_spaces(i + 3);
    if (at(i, "%}")) return i + 2;
    return std::string::npos;
  }

  // The end of a block tag's closing ("+%}", "-%}" and whitespace, "%}" and one newline) at i, or npos.
  size_t block_close(size_t i) const {
    if (at(i, "+%}")) return i + 3;
    if (at(i, "-%}")) return skip_spaces(i + 3);
    if (at(i, "%}")) return i + 2 + (i + 2 < n_ && s_[i + 2] == '\n' ? 1 : 0);
    return std::string::npos;
  }

  void raw_body(size_t begin) {
    for (size_t j = s_.find("{%", pos_); j != std::string::npos; j = s_.find("{%", j + 1)) {
      size_t i = j + 2;
      const char sign = i < n_ && (s_[i] == '-' || s_[i] == '+') ? s_[i] : 0;
      if (sign != 0) ++i;
      i = skip_spaces(i);
      if (!at(i, "endraw")) continue;
      const size_t end = block_close(skip_spaces(i + 6));
      if (end == std::string::npos) continue;
      std::string data = s_.substr(pos_, j - pos_);
      strip_before(data, sign, true);
      if (!data.empty()) emit(Tok::Data, pos_, std::move(data));
      pos_ = end;
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
    throw SyntaxFailure{begin, "missing end of raw directive ({% endraw %})"};
  }

  void comment(size_t begin) {
    for (size_t i = pos_; i < n_; ++i) {
      size_t end = std::string::npos;
      if (at(i, "+#}"))
        end = i + 3;
      else if (at(i, "-#}"))
        end = skip_spaces(i + 3);
      else if (at(i, "#}"))
        end = i + 2 + (i + 2 < n_ && s_[i + 2] == '\n' ? 1 : 0);
      if (end == std::string::npos) continue;
      pos_ = end;
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
    throw SyntaxFailure{begin, "missing end of comment tag ('#}')"};
  }

  void in_tag(bool block, size_t begin) {
    balance_.clear();
    while (true) {
      if (pos_ >= n_) throw SyntaxFailure{begin, block ? "unclosed tag: missing '%}'" : "unclosed tag: missing '}}'"};
      if (balance_.empty()) {
        size_t end = std::string::npos;
        if (block)
          end = block_close(pos_);
        else if (at(pos_, "-}}"))
          end = skip_spaces(pos_ + 3);
        else if (at(pos_, "}}"))
          end = pos_ + 2;
        if (end != std::string::npos) {
          emit(block ? Tok::BlockEnd : Tok::VarEnd, pos_);
          pos_ = end;
          line_starting_ = s_[end - 1] == '\n';
          return;
        }
      }
      const size_t sp = text::space_prefix(s_, pos_);
      if (sp > 0) {
        pos_ += sp;
        continue;
      }
      if (!number() && !name() && !string() && !op())
        throw SyntaxFailure{pos_, std::string("unexpected character '") + s_[pos_] + "'"};
    }
  }

  // (\d+_)*\d+ at p: its end, or npos.
  size_t digits_us(size_t p) const {
    if (p >= n_ || !is_digit(s_[p])) return std::string::npos;
    size_t i = p;
    while (i < n_ && is_digit(s_[i])) ++i;
    while (i + 1 < n_ && s_[i] == '_' && is_digit(s_[i + 1])) {
      ++i;
      while (i < n_ && is_digit(s_[i])) ++i;
    }
    return i;
  }

  // e[+-]?(\d+_)*\d+ at r (either case): its end, or npos.
  size_t exponent(size_t r) const {
    if (r >= n_ || (s_[r] != 'e' && s_[r] != 'E')) return std::string::npos;
    size_t q = r + 1;
    if (q < n_ && (s_[q] == '+' || s_[q] == '-')) ++q;
    return digits_us(q);
  }

  // Jinja's float_re: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)
  size_t match_float(size_t p) const {
    if (p > 0 && s_[p - 1] == '.') return std::string::npos;
    const size_t a = digits_us(p);
    if (a == std::string::npos) return a;
    const size_t frac = a < n_ && s_[a] == '.' ? digits_us(a + 1) : std::string::npos;
    if (frac != std::string::npos) {
      const size_t e = exponent(frac);
      if (e != std::string::npos) return e;
    }
    const size_t e = exponent(a);
    return e != std::string::npos ? e : frac;
  }

  // Jinja's integer_re: 0b.., 0o.., 0x.. (underscores between digits), [1-9](_?\d)*, 0(_?0)*.
  size_t match_int(size_t p, int* base) const {
    auto run = [&](size_t i, auto ok) {
      size_t count = 0;
      while (true) {
        const size_t j = i < n_ && s_[i] == '_' ? i + 1 : i;
        if (j < n_ && ok(s_[j])) {
          i = j + 1;
          ++count;
        } else {
          return std::make_pair(i, count);
        }
      }
    };
    *base = 10;
    if (s_[p] == '0' && p + 1 < n_) {
      const char c = static_cast<char>(s_[p + 1] | 0x20);
      const int b = c == 'b' ? 2 : c == 'o' ? 8 : c == 'x' ? 16 : 0;
      if (b != 0) {
        const auto [end, count] = run(p + 2, [b](char d) { return hex_value(d) >= 0 && hex_value(d) < b; });
        if (count > 0) {
          *base = b;
          return end;
        }
      }
    }
    if (s_[p] >= '1' && s_[p] <= '9') return run(p + 1, is_digit).first;
    if (s_[p] == '0') return run(p + 1, [](char d) { return d == '0'; }).first;
    return std::string::npos;
  }

  bool number() {
    const size_t fend = match_float(pos_);
    std::string digits;
    if (fend != std::string::npos) {
      for (size_t i = pos_; i < fend; ++i)
        if (s_[i] != '_') digits += s_[i];
      Token t{Tok::Float, pos_, {}};
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.float_value);
      if (r.ec == std::errc::result_out_of_range)
        t.float_value =
            digits.find("e-") != std::string::npos || digits.find("E-") != std::string::npos ? 0.0 : HUGE_VAL;
      out_.push_back(std::move(t));
      pos_ = fend;
      return true;
    }
    int base = 10;
    const size_t iend = match_int(pos_, &base);
    if (iend == std::string::npos) return false;
    for (size_t i = pos_ + (base == 10 ? 0 : 2); i < iend; ++i)
      if (s_[i] != '_') digits += s_[i];
    Token t{Tok::Int, pos_, {}};
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.int_value, base);
    if (r.ec != std::errc()) throw SyntaxFailure{pos_, "integer literal too large (ints are 64-bit here)"};
    out_.push_back(std::move(t));
    pos_ = iend;
    return true;
  }

  bool name() {
    if (!is_name_start(s_[pos_])) return false;
    size_t i = pos_;
    while (i < n_ && is_name_char(s_[i])) ++i;
    emit(Tok::Name, pos_, s_.substr(pos_, i - pos_));
    pos_ = i;
    return true;
  }

  bool string() {
    const char q = s_[pos_];
    if (q != '\'' && q != '"') return false;
    size_t i = pos_ + 1;
    while (i < n_ && s_[i] != q) i += s_[i] == '\\' ? 2 : 1;
    if (i >= n_) throw SyntaxFailure{pos_, "unterminated string literal"};
    const std::string raw = s_.substr(pos_ + 1, i - pos_ - 1);
    emit(Tok::String, pos_, Unescaper(raw, pos_).run());
    pos_ = i + 1;
    return true;
  }

  bool op() {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* o : kTwo)
      if (at(pos_, o)) {
        emit(Tok::Op, pos_, o);
        pos_ += 2;
        return true;
      }
    const char c = s_[pos_];
    if (std::strchr("+-/*%~[](){}|,;:.=<>", c) == nullptr || c == 0) return false;
    if (c == '(' || c == '[' || c == '{') balance_ += c == '(' ? ')' : c == '[' ? ']' : '}';
    if (c == ')' || c == ']' || c == '}') {
      if (balance_.empty()) throw SyntaxFailure{pos_, std::string("unexpected '") + c + "'"};
      if (balance_.back() != c)
        throw SyntaxFailure{pos_, std::string("unexpected '") + c + "', expected '" + balance_.back() + "'"};
      balance_.pop_back();
    }
    emit(Tok::Op, pos_, std::string(1, c));
    ++pos_;
    return true;
  }
};

}  // namespace lexer_impl

std::vector<Token> tokenize(const std::string& source) { return lexer_impl::Lexer(source).run(); }

}  // namespace wm::llm::jinja
