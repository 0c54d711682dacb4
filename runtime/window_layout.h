#pragma once
// Bookkeeping of the window, apart from the tensors: named regions in a declared order, each a
// list of segments (one per block placed), each segment with a token count per layer. Per layer
// the window's used prefix is the concatenation of all segments in region order. No tensors
// here, so it is testable alone.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wm {

class WindowLayout {
 public:
  struct Segment {
    std::string id;
    std::vector<int64_t> len;  // tokens per layer
  };

  // regions: names in the order they sit in every layer's buffer. Throws wm::Error on an empty
  // or duplicate name, or n_layers <= 0.
  WindowLayout(std::vector<std::string> regions, int n_layers);

  int n_layers() const { return n_layers_; }
  int n_regions() const { return static_cast<int>(regions_.size()); }
  const std::vector<std::string>& region_names() const { return regions_; }
  // Index of the region called name; throws wm::Error naming it and the known ones if absent.
  int region(const std::string& name) const;
  const std::vector<Segment>& segments(int r) const { return segs_.at(r); }

  // First token of region r in layer l, and one past its last.
  int64_t region_begin(int l, int r) const;
  int64_t region_end(int l, int r) const;
  int64_t region_size(int l, int r) const { return region_end(l, r) - region_begin(l, r); }
  // Tokens used in layer l.
  int64_t size(int l) const { return region_end(l, n_regions() - 1); }

  // Where segment `id` is: {region, index in region}; {-1, -1} if absent.
  std::pair<int, int> find(const std::string& id) const;
  // First token of segment `id` in layer l. Throws if absent.
  int64_t segment_begin(int l, const std::string& id) const;
  int64_t segment_len(int l, const std::string& id) const;

  // Adds an empty segment at the end of region r; throws if the id is already in the window.
  void add_segment(int r, const std::string& id);
  // Grows segment `id` by n tokens in layer l (which must then be appended at its end).
  void grow(int l, const std::string& id, int64_t n);
  // Removes segment `id` from every layer; throws if absent.
  Segment remove(const std::string& id);
  // Removes every segment of region r; returns them in order.
  std::vector<Segment> clear_region(int r);
  // Removes tokens [begin, begin + n) of region r in layer l (region coordinates), shrinking
  // the segments they fall in. Throws if the range leaves the region.
  void drop_tokens(int l, int r, int64_t begin, int64_t n);
  // Keeps only the tokens at `keep` of layer l (layer coordinates, strictly increasing, each
  // below size(l)): each segment shrinks to the kept tokens that fell in it (possibly none; the
  // segment stays). Throws wm::Error on an index out of range or out of order.
  void keep_tokens(int l, const std::vector<int64_t>& keep);

 private:
  std::vector<std::string> regions_;
  int n_layers_;
  std::vector<std::vector<Segment>> segs_;
};

}  // namespace wm
