#include "runtime/window_layout.h"

#include <set>

#include "runtime/error.h"

namespace wm {

WindowLayout::WindowLayout(std::vector<std::string> regions, int n_layers)
    : regions_(std::move(regions)), n_layers_(n_layers), segs_(regions_.size()) {
  WM_CHECK(n_layers > 0, "n_layers must be > 0, got ", n_layers);
  WM_CHECK(!regions_.empty(), "a window needs at least one region");
  std::set<std::string> seen;
  for (auto& r : regions_) {
    WM_CHECK(!r.empty(), "region names must not be empty");
    WM_CHECK(seen.insert(r).second, "region '", r, "' is declared twice");
  }
}

int WindowLayout::region(const std::string& name) const {
  for (size_t i = 0; i < regions_.size(); ++i)
    if (regions_[i] == name) return static_cast<int>(i);
  std::string known;
  for (auto& r : regions_) known += (known.empty() ? "" : ", ") + r;
  throw Error(str_cat("window: no region '", name, "' (regions: ", known, ")"));
}

int64_t WindowLayout::region_begin(int l, int r) const {
  WM_CHECK(l >= 0 && l < n_layers_, "layer ", l, " out of range [0, ", n_layers_, ")");
  WM_CHECK(r >= 0 && r < n_regions(), "region ", r, " out of range");
  int64_t off = 0;
  for (int i = 0; i < r; ++i)
    for (auto& s : segs_[i]) off += s.len[l];
  return off;
}

int64_t WindowLayout::region_end(int l, int r) const {
  int64_t off = region_begin(l, r);
  for (auto& s : segs_[r]) off += s.len[l];
  return off;
}

std::pair<int, int> WindowLayout::find(const std::string& id) const {
  for (int r = 0; r < n_regions(); ++r)
    for (size_t i = 0; i < segs_[r].size(); ++i)
      if (segs_[r][i].id == id) return {r, static_cast<int>(i)};
  return {-1, -1};
}

int64_t WindowLayout::segment_begin(int l, const std::string& id) const {
  auto [r, i] = find(id);
  WM_CHECK(r >= 0, "no segment '", id, "' in the window");
  int64_t off = region_begin(l, r);
  for (int j = 0; j < i; ++j) off += segs_[r][j].len[l];
  return off;
}

int64_t WindowLayout::segment_len(int l, const std::string& id) const {
  auto [r, i] = find(id);
  WM_CHECK(r >= 0, "no segment '", id, "' in the window");
  return segs_[r][i].len.at(l);
}

void WindowLayout::add_segment(int r, const std::string& id) {
  WM_CHECK(r >= 0 && r < n_regions(), "region ", r, " out of range");
  WM_CHECK(find(id).first < 0, "segment '", id, "' is already in the window");
  segs_[r].push_back(Segment{id, std::vector<int64_t>(n_layers_, 0)});
}

void WindowLayout::grow(int l, const std::string& id, int64_t n) {
  auto [r, i] = find(id);
  WM_CHECK(r >= 0, "no segment '", id, "' in the window");
  WM_CHECK(n >= 0, "cannot grow by ", n);
  segs_[r][i].len.at(l) += n;
}

WindowLayout::Segment WindowLayout::remove(const std::string& id) {
  auto [r, i] = find(id);
  WM_CHECK(r >= 0, "no segment '", id, "' in the window");
  Segment s = std::move(segs_[r][i]);
  segs_[r].erase(segs_[r].begin() + i);
  return s;
}

std::vector<WindowLayout::Segment> WindowLayout::clear_region(int r) {
  WM_CHECK(r >= 0 && r < n_regions(), "region ", r, " out of range");
  std::vector<Segment> out = std::move(segs_[r]);
  segs_[r].clear();
  return out;
}

void WindowLayout::drop_tokens(int l, int r, int64_t begin, int64_t n) {
  WM_CHECK(begin >= 0 && n >= 0 && begin + n <= region_size(l, r), "tokens [", begin, ", ", begin + n,
           ") leave region '", regions_.at(r), "' of ", region_size(l, r), " tokens in layer ", l);
  int64_t off = 0;
  for (auto& s : segs_[r]) {
    const int64_t s0 = off, s1 = off + s.len[l];
    const int64_t a = std::max(s0, begin), b = std::min(s1, begin + n);
    off = s1;
    if (b > a) s.len[l] -= (b - a);
  }
}

void WindowLayout::keep_tokens(int l, const std::vector<int64_t>& keep) {
  WM_CHECK(l >= 0 && l < n_layers_, "layer ", l, " out of range [0, ", n_layers_, ")");
  const int64_t n = size(l);
  for (size_t i = 0; i < keep.size(); ++i) {
    WM_CHECK(keep[i] >= 0 && keep[i] < n, "token ", keep[i], " to keep is outside layer ", l, " (", n, " tokens)");
    WM_CHECK(i == 0 || keep[i] > keep[i - 1], "tokens to keep must be strictly increasing: ", keep[i - 1],
             " then ", keep[i]);
  }
  size_t i = 0;
  int64_t off = 0;
  for (auto& region : segs_)
    for (auto& s : region) {
      const int64_t end = off + s.len[l];
      int64_t kept = 0;
      while (i < keep.size() && keep[i] < end) ++kept, ++i;
      off = end;
      s.len[l] = kept;
    }
}

}  // namespace wm
