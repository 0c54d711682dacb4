#include "llmkv/bert_chars.h"

#include <algorithm>
#include <iterator>

namespace wm::llm::bert_chars {
namespace {

struct CharRun {
  uint32_t start;  // the flags hold from here to the next run's start
  uint8_t flags;
};
struct DeltaRun {
  uint32_t start;  // start + stride * i maps to itself + delta, for i < count
  uint16_t count;
  uint8_t stride;
  int32_t delta;
};
struct MultiMap {
  uint32_t from;
  uint32_t to[3];  // zero-terminated when shorter
};

#include "llmkv/bert_chars_tables.inc"

constexpr char32_t kHangulBase = 0xAC00, kHangulCount = 11172;

// The run of `runs` whose code points may include c (the last one starting at or before c).
template <class Run, size_t N>
const Run* run_before(const Run (&runs)[N], char32_t c) {
  auto it = std::upper_bound(std::begin(runs), std::end(runs), c,
                             [](char32_t v, const Run& r) { return v < r.start; });
  return it == std::begin(runs) ? nullptr : &*std::prev(it);
}

// The single-code-point image of c under `runs`, or 0 when it has none.
template <size_t N>
char32_t delta_map(const DeltaRun (&runs)[N], char32_t c) {
  const DeltaRun* r = run_before(runs, c);
  if (!r) return 0;
  const char32_t off = c - r->start;
  if (off % r->stride != 0 || off / r->stride >= r->count) return 0;
  return static_cast<char32_t>(static_cast<int64_t>(c) + r->delta);
}

// Appends the multi-code-point image of c under `maps`; false when it has none.
template <size_t N>
bool multi_map(const MultiMap (&maps)[N], char32_t c, std::u32string& out) {
  auto it = std::lower_bound(std::begin(maps), std::end(maps), c,
                             [](const MultiMap& m, char32_t v) { return m.from < v; });
  if (it == std::end(maps) || it->from != c || it->to[0] == 0) return false;
  for (char32_t x : it->to)
    if (x) out.push_back(x);
  return true;
}

}  // namespace

uint8_t flags(char32_t c) {
  if (c > 0x10FFFF) return 0;
  const CharRun* r = run_before(kFlagRuns, c);
  return r ? r->flags : 0;
}

void append_stripped(char32_t c, std::u32string& out) {
  if (c >= kHangulBase && c < kHangulBase + kHangulCount) {  // the standard's algorithm
    const char32_t s = c - kHangulBase;
    out.push_back(0x1100 + s / 588);
    out.push_back(0x1161 + (s % 588) / 28);
    if (s % 28) out.push_back(0x11A7 + s % 28);
    return;
  }
  if (flags(c) & kMark) return;
  if (const char32_t one = delta_map(kStripRuns, c)) {
    out.push_back(one);
    return;
  }
  if (multi_map(kStripMulti, c, out)) return;
  out.push_back(c);
}

void append_lower(char32_t c, std::u32string& out) {
  if (const char32_t one = delta_map(kLowerRuns, c)) {
    out.push_back(one);
    return;
  }
  if (multi_map(kLowerMulti, c, out)) return;
  out.push_back(c);
}

}  // namespace wm::llm::bert_chars
