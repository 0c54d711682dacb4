#pragma once
// The active KV cache: per layer, preallocated K/V/log-weight buffers holding named regions in
// a declared order ([sink | retrieved | recent] for video, [system | blocks | recent] for text).
// Appends and placements write in place; drops compact. Capacity grows ahead of need, by a
// factor that differs per layer, so that reallocations of different layers fall on different
// steps (OpenVINO's staggered growth). Attention reads views of the used prefix. Each segment
// keeps its block's metadata and statistics: what is placed comes back out with them.
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/block.h"
#include "runtime/kv_spec.h"
#include "runtime/mapped_storage.h"
#include "runtime/window_layout.h"

namespace wm {

struct WindowGrowth {
  double factor = 1.5;    // a layer that must grow takes need * factor * (1 + stagger * l / L),
                          // rounded up to the granule, plus l granules when stagger > 0
  double stagger = 0.5;   // 0: all layers grow alike (and reallocate on the same step)
  int64_t granule = 16;   // grown capacities are multiples of this (a reserve() is exact)
};

// The per-head log-weight of a token its kv head does not see (per-head selection): its score
// falls below every other's, its softmax weight is exactly 0 (finite, so that a range of keys
// one head sees none of still has a finite maximum).
constexpr float kHiddenLogw = -1e30f;

// A shift of a placed block's positions on one RoPE axis, keys rotated to match.
struct Reanchor {
  int axis = 0;
  int64_t delta = 0;
};

class KvWindow {
 public:
  // initial_capacity: tokens preallocated per layer (before the per-layer stagger).
  KvWindow(KvSpec spec, std::vector<std::string> regions, int64_t initial_capacity = 0, WindowGrowth growth = {});

  const KvSpec& spec() const { return spec_; }
  const WindowLayout& layout() const { return layout_; }

  // Keeps K and V in files of `storage` from here on (mapped_storage.h: the kernel pages them
  // to disk when memory runs short), the tokens held so far moved there; null: back in memory.
  // Log-weights and positions stay in memory. Throws wm::Error on a window that is not on the
  // CPU, or when the storage cannot take the buffers (the window is then unchanged).
  void use_storage(std::shared_ptr<const MappedStorage> storage);
  const std::shared_ptr<const MappedStorage>& storage() const { return storage_; }

  // Appends n tokens to layer l of segment `id` at the end of `region` (the segment is created
  // there if new, with empty metadata). k, v [n_kv_heads, n, head_dim] already rotated; pos
  // [n, n_axes] (CPU); logw [n] or undefined (zeros). Throws wm::Error on a shape mismatch or if
  // `id` sits in another region.
  void append(const std::string& region, const std::string& id, int l, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& pos, const at::Tensor& logw = {});
  // Copies every layer of `block` into a new segment at the end of `region`, optionally
  // re-anchored (keys rotated, positions shifted; V untouched), and keeps its metadata and
  // statistics with the segment.
  void place(const std::string& region, const Block& block, std::optional<Reanchor> reanchor = std::nullopt);
  // A copy of segment `id` as a block (K, V, log-weights on the window's device), with the
  // metadata and statistics it was placed with. Throws wm::Error if absent.
  Block extract(const std::string& id) const;
  // A segment of a layer with per-head log-weights (keep_tokens_per_head) is not extracted: a
  // block has one log-weight per token, and its tokens some heads do not see would come back
  // seen by all: wm::Error, naming the segment.
  // extract() then drop the segment, compacting every layer.
  Block remove(const std::string& id);
  // Drops the segment, compacting every layer, without copying it out (a block kept elsewhere).
  void drop(const std::string& id);
  // Drops every segment of the region, compacting.
  void drop_region(const std::string& region);
  // Drops tokens [begin, begin + n) of `region` in layer l (region coordinates), compacting.
  void drop_tokens(const std::string& region, int l, int64_t begin, int64_t n);
  // Keeps only the tokens at `keep` of layer l (layer coordinates, strictly increasing),
  // compacting in one gather: token eviction (H2O, SnapKV, ...). Segments shrink by what they
  // lost and stay, even when empty in a layer. Throws wm::Error on an index out of range or
  // out of order.
  void keep_tokens(int l, const std::vector<int64_t>& keep);
  // Per-head selection (SnapKV, PyramidKV, AdaKV as published: each kv head its own tokens):
  // keep[h] lists the tokens kv head h keeps (layer coordinates, strictly increasing). The layer
  // keeps their union, compacted as keep_tokens() does (segments, positions and RoPE untouched),
  // and each head stops seeing the union's tokens it did not list: their per-head log-weight
  // becomes kHiddenLogw. A token a head no longer sees stays unseen by it; tokens appended or
  // placed later are seen by every head. Throws wm::Error on a list count other than n_kv_heads,
  // an index out of range or out of order.
  void keep_tokens_per_head(int l, const std::vector<std::vector<int64_t>>& keep);
  // Overwrites the K/V and log-weights of layer l's tokens at `idx` (layer coordinates,
  // distinct) with k, v [n_kv_heads, m, head_dim] and logw [m], and their positions with pos
  // [m, n_axes] when given; segments stay (KeepKV's merged entries, its rebuilt cache). Throws
  // wm::Error on a shape mismatch or an index out of range.
  void write_tokens(int l, const std::vector<int64_t>& idx, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& logw, const at::Tensor& pos = {});
  // Per-head merging (KeepKV per kv head): overwrites kv head h's K/V of layer l's tokens at
  // `idx` (layer coordinates, distinct) with k, v [1, m, head_dim], and sets their log-weight
  // for head h to logw [m] (the whole log-weight the head's scores take: the per-head row
  // becomes logw - logw(l)); the other heads' K/V and weights stay. Throws wm::Error on a shape
  // mismatch, a head or an index out of range.
  void write_head_tokens(int l, int h, const std::vector<int64_t>& idx, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& logw);
  // Moves layer l's tokens [begin, begin + n) by re.delta on RoPE axis re.axis: positions
  // shifted, keys rotated to match, V and log-weights untouched (StreamingLLM's re-anchoring of
  // what follows an evicted span). Throws wm::Error if the range leaves the layer.
  void shift_tokens(int l, int64_t begin, int64_t n, Reanchor re);
  // Every segment, every layer, gone; capacity kept.
  void clear();

  // The metadata and statistics of segment `id`. Throws wm::Error if absent.
  const BlockMeta& meta(const std::string& id) const;
  // Replaces segment `id`'s metadata (a segment appended token by token starts with none). An
  // absent segment is made, empty, at the end of `region` when one is given; else wm::Error.
  void set_meta(const std::string& id, BlockMeta meta, const std::string& region = "");
  const BlockStats& stats(const std::string& id) const;

  // Grows the capacity of every layer below `tokens` to exactly `tokens` (no factor, no
  // stagger), so that filling a layer up to `tokens` reallocates no more.
  void reserve(int64_t tokens);

  // Views of layer l's used prefix: K, V [n_kv_heads, n, head_dim]; logw [n]; pos [n, n_axes] (CPU).
  at::Tensor k(int l) const;
  at::Tensor v(int l) const;
  at::Tensor logw(int l) const;
  at::Tensor pos(int l) const;
  // Layer l's per-head log-weights [n_kv_heads, n] float32, added to logw(l) for each kv head's
  // scores (kHiddenLogw: a token that head does not see); undefined while every head sees every
  // token alike (no per-head selection since the last clear()).
  at::Tensor head_logw(int l) const;
  bool has_head_logw(int l) const { return hlogw_.at(l).defined(); }
  // The tokens of layer l that kv head h sees: size(l) without per-head selection.
  int64_t visible(int l, int h) const;
  int64_t size(int l) const { return layout_.size(l); }
  int64_t capacity(int l) const { return cap_.at(l); }

  // Writes the current tokens' k_cur, v_cur [n_kv_heads, c, head_dim] just after layer l's used
  // prefix (growing if needed) and returns views {K, V, logw} over [0, size + c), log-weights of
  // the current tokens 0: attention over window + current without a concatenation. The staged
  // tokens are not part of the window: the next mutation may overwrite them. head_logw [n_kv_heads,
  // size + c] (the current tokens' 0) when the layer has per-head log-weights, else undefined:
  // head h's scores then take logw + head_logw[h].
  struct Staged {
    at::Tensor k, v, logw;
    int64_t n_window;
    at::Tensor head_logw;
  };
  Staged stage(int l, const at::Tensor& k_cur, const at::Tensor& v_cur);
  // Appends the c tokens the last stage(l, ...) wrote (layer l unchanged since), as append()
  // would append them: to segment `id` at the end of `region`, positions pos [c, n_axes] on the
  // CPU, log-weights 0. When the segment ends the layer, as a decode step's does, the staged K/V
  // are in place already and only the positions are written. Throws as append() does.
  void commit_staged(const std::string& region, const std::string& id, int l, int64_t c, const at::Tensor& pos);
  // The same with positions as c * n_axes values.
  void commit_staged(const std::string& region, const std::string& id, int l, int64_t c, const int64_t* pos);
  // For a caller that writes the staged tokens itself (the batched decode step, on the CPU):
  // stages c tokens of layer l as stage() does (growing the layer, their log-weights 0) and says
  // where they go: kv head h's token j at k (or v) + h * head_stride + j * head_dim elements, in
  // the spec's dtype. Throws wm::Error for a layer with per-head log-weights or off the CPU.
  struct RawStage {
    void* k;
    void* v;
    int64_t head_stride;
    const float* logw;  // [n + c]
    int64_t n;          // tokens before the staged ones
  };
  RawStage stage_raw(int l, int64_t c);

  // How many times layer l's buffers were reallocated to grow (a reserve() that grows it
  // included; the constructor's allocation not).
  int64_t reallocations(int l) const { return reallocs_.at(l); }
  // Bytes allocated (capacity) and used, over all layers, K+V+log-weights.
  size_t bytes_allocated() const;
  size_t bytes_used() const;

 private:
  // Grows layer l to hold `need` tokens if it holds fewer: to exactly `need` when factor <= 1 (a
  // reserve), else to staggered_capacity(l, need, factor).
  void ensure(int l, int64_t need, double factor);
  // need * factor, staggered by layer (see window.cpp), in granules.
  int64_t staggered_capacity(int l, int64_t need, double factor) const;
  // Where layer l of segment `id` ends (the segment made, empty, at the end of `region` if new).
  // Throws wm::Error if `id` sits in another region.
  int64_t segment_end(const std::string& region, const std::string& id, int l);
  // Throws wm::Error unless idx are distinct tokens of layer l.
  void check_written(int l, const std::vector<int64_t>& idx) const;
  void insert_at(int l, int64_t at, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos,
                 const at::Tensor& logw);
  void erase_at(int l, int64_t at, int64_t n);
  // A K or V buffer of `cap` tokens: in the storage when there is one.
  at::Tensor kv_buffer(int64_t cap) const;

  KvSpec spec_;
  WindowLayout layout_;
  WindowGrowth growth_;
  std::vector<at::Tensor> k_, v_, logw_, pos_;
  std::vector<at::Tensor> hlogw_;  // per layer [n_kv_heads, capacity] float32, or undefined
  std::vector<int64_t> cap_;
  std::vector<int64_t> reallocs_;
  struct Info {
    BlockMeta meta;
    BlockStats stats;
  };
  std::unordered_map<std::string, Info> info_;  // per segment id, exactly the layout's segments
  std::shared_ptr<const MappedStorage> storage_;
};

}  // namespace wm
