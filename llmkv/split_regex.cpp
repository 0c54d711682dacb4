#include "llmkv/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "runtime/error.h"

namespace wm::llm {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? str_cat("PCRE2 error ", code) : std::string(reinterpret_cast<const char*>(buf), n);
}

struct MatchData {
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (!md) throw Error("SplitRegex: out of memory for PCRE2 match data");
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* md;
};

bool is_cont(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(const std::string& pattern, bool literal) : pattern_(pattern), literal_(literal) {
  if (literal && pattern.empty()) throw Error("SplitRegex: an empty string cannot be a split pattern");
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                             &err_offset, nullptr);
  if (!code->code)
    throw Error(str_cat("SplitRegex: pattern \"", pattern, "\" does not compile at offset ", err_offset, ": ",
                        pcre2_message(err)));
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  code_ = std::move(code);
}

void SplitRegex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchData data(code_->code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    int rc = pcre2_match(code_->code, subject, s.size(), start, 0, data.md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(code_->code, subject, s.size(), start, PCRE2_NO_JIT, data.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw Error(str_cat("SplitRegex::find_all: pattern \"", pattern_, "\" failed at byte ", start, " of ",
                          s.size(), ": ", pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {  // an empty match: step over one character (or one stray byte)
      start = b + 1;
      while (start < s.size() && is_cont(s[start])) ++start;
    }
  }
}

bool SplitRegex::matches_at(std::string_view s, size_t offset) const {
  if (offset > s.size()) return false;
  MatchData data(code_->code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  int rc = pcre2_match(code_->code, subject, s.size(), offset, PCRE2_ANCHORED, data.md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code_->code, subject, s.size(), offset, PCRE2_ANCHORED | PCRE2_NO_JIT, data.md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)
    throw Error(str_cat("SplitRegex::matches_at: pattern \"", pattern_, "\" failed at byte ", offset, ": ",
                        pcre2_message(rc)));
  return true;
}

void split_pieces(const SplitRegex& re, SplitBehavior behavior, bool invert, std::string_view s,
                  std::vector<std::string_view>& out) {
  struct Span {
    size_t b, e;
    bool match;
  };
  std::vector<std::pair<size_t, size_t>> found;
  re.find_all(s, found);
  std::vector<Span> spans;  // matches and gaps, covering s
  size_t prev = 0;
  for (const auto& [b, e] : found) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < s.size() || spans.empty()) spans.push_back({prev, s.size(), invert});

  std::vector<Span> merged;
  switch (behavior) {
    case SplitBehavior::Isolated:
      merged = spans;
      for (auto& sp : merged) sp.match = false;
      break;
    case SplitBehavior::Removed:
      merged = spans;  // the matches are dropped below
      break;
    case SplitBehavior::Contiguous: {
      bool previous = false;
      for (const auto& sp : spans) {
        if (sp.match == previous && !merged.empty())
          merged.back().e = sp.e;
        else
          merged.push_back({sp.b, sp.e, false});
        previous = sp.match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous = false;
      for (const auto& sp : spans) {
        if (sp.match && !previous && !merged.empty())
          merged.back().e = sp.e;
        else
          merged.push_back({sp.b, sp.e, false});
        previous = sp.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous && !merged.empty())
          merged.back().b = it->b;
        else
          merged.push_back({it->b, it->e, false});
        previous = it->match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  for (const auto& sp : merged)
    if (!sp.match && sp.e > sp.b) out.push_back(s.substr(sp.b, sp.e - sp.b));
}

}  // namespace wm::llm
