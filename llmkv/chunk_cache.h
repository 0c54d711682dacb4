#pragma once
// A chunk KV cache on the core's BlockStore. Any text segment (a memory line, a few-shot example,
// a document) can be prefilled on its own, from position 0 with nothing before it, and kept under
// a key hashed from the model and the segment's token ids (a "chunk" entry); or kept as computed
// inside a prompt, after everything before it, under a key chained over the segments so far as
// LMCache chains its chunk hashes (a "prefix" entry: an unchanged prefix is found whole, its K/V
// exact). Assembling a prompt from chunk entries places each one re-anchored at its offset in the
// new prompt (one RoPE rotation, llmkv/recompute/blend.h); which tokens are then recomputed is a
// recompute policy's choice (llmkv/recompute/recompute_policy.h).
//
// An entry is stored as one block per layer, id "kv:<key in hex>:<layer>", so that a loader can
// bring it in a layer at a time (runtime/layer_loader.h, LayerQueueLoader). The blocks live in
// the store's tiers (device, host, disk spill files with checksums) under its byte budgets. A
// damaged spill file is reported (report_corrupt): the entry is erased, counted, and never used.
//
// With a remote store (cfg.store.remote, runtime/remote_store.h; its namespace must be the model
// key in hex), every entry put is also published there, and an entry this cache does not hold is
// looked for there (lookup, contains) and brought in whole: processes of the same model share
// their chunks. A remote value that is damaged, of another model, late or unreachable is a miss,
// and the caller computes the entry itself.
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmkv/model.h"
#include "runtime/block.h"
#include "runtime/block_store.h"

namespace wm::llm {

using ChunkKey = uint64_t;

// XXH64 over the model's config (as JSON) and every parameter's bytes, in name order: the model
// part of every key (other weights, other keys). Reads all parameters once (~0.3 s for 0.5B).
uint64_t model_fingerprint(LlmModelImpl& model);

// The K/V of a segment as some computation left them.
struct ChunkKv {
  std::vector<LayerKv> layers;  // per layer: K, V [n_kv_heads, n, head_dim] (K rotated), positions
                                // [n, 1] int64 CPU, log-weights [n] float32 (zeros)
  at::Tensor signature;         // [hidden] float32 CPU: the mean of the last layer's normed hidden
                                // states, a semantic signature of the text; may be undefined
  int64_t n_tokens() const { return layers.empty() ? 0 : layers[0].n_tokens(); }
  int64_t first_position() const;  // positions[0] of layer 0 (0 for an empty entry)
};

struct ChunkCacheConfig {
  StoreConfig store;            // tiers, byte budgets, spill folder; the device is the model's
  Tier tier = Tier::Host;       // where new entries go first (they demote under the budgets)
  int64_t prefill_chunk = 512;  // tokens per forward pass when prefilling a segment
  uint64_t model_key = 0;       // the model's fingerprint; 0: computed (model_fingerprint)
  void validate() const;        // throws wm::Error naming the field
};

struct ChunkCacheStats {
  int64_t hits = 0, misses = 0;  // lookup() calls that found / did not find an entry
  int64_t stored = 0;            // entries put
  int64_t prefilled_tokens = 0;  // tokens prefilled alone by prefill()
  int64_t corrupt = 0;           // entries erased because a spill file was damaged
  int64_t erased = 0;            // entries erased by erase() (invalidated)
  int64_t remote_hits = 0;       // entries brought in from the remote store
  int64_t remote_misses = 0;     // entries looked for there and not found whole
};

class ChunkCache {
 public:
  // Throws wm::Error on a bad config (no spill_dir while the disk tier may be needed is reported
  // later, by the store, when something first goes there).
  ChunkCache(LlmModel model, ChunkCacheConfig cfg);

  uint64_t model_key() const { return model_key_; }
  // The key of a segment's ids alone (XXH64 seeded with the model key). Different ids, or
  // another model, give another key.
  ChunkKey chunk_key(const std::vector<int64_t>& ids) const;
  // LMCache's chain: the prefix key of a segment given the prefix key of everything before it
  // (0 for the first segment) and the segment's chunk key. Never equal to a chunk key by design
  // (a separate seed), so prefix and chunk entries do not collide.
  ChunkKey prefix_key(ChunkKey previous, ChunkKey chunk) const;
  // The prefix keys of consecutive segments.
  std::vector<ChunkKey> prefix_keys(const std::vector<std::vector<int64_t>>& segments) const;

  // Runs ids alone (an empty window) at positions first_position, first_position + 1, ... in
  // chunks of prefill_chunk, and returns every layer's K/V and the signature. Throws wm::Error on
  // empty ids or ids outside the vocabulary.
  ChunkKv prefill(const std::vector<int64_t>& ids, int64_t first_position = 0);

  // Stores an entry (replacing one under the same key) as one block per layer in cfg.tier (or a
  // lower tier, as the budgets allow). kind: "chunk", "group", "prefix", ... (informative).
  // Throws wm::Error when no tier can take it.
  void put(ChunkKey key, const ChunkKv& kv, const std::string& kind);
  // Whether the entry is there (every layer of it), counting a hit or a miss.
  bool lookup(ChunkKey key);
  // Whether the entry is there, without counting a hit or a miss (the remote store is asked, as by
  // lookup(), and its counters move).
  bool contains(ChunkKey key) const;
  // Tokens, kind and signature of an entry. Throw wm::Error if absent (signature: undefined when
  // none was stored).
  int64_t tokens(ChunkKey key) const;
  const std::string& kind(ChunkKey key) const;
  at::Tensor signature(ChunkKey key) const;
  // The first position the entry's K/V were computed at (0 for chunk entries).
  int64_t first_position(ChunkKey key) const;
  // The store's id of layer l's block of an entry (what LayerQueueLoader is given).
  std::string block_id(ChunkKey key, int l) const;
  // The tier layer l's block is in. Throws wm::Error if absent.
  Tier tier_of(ChunkKey key, int l) const;
  // Layer l of an entry on the model's device, read synchronously. A damaged spill file is
  // reported (report_corrupt) and rethrown as wm::CorruptData; an absent entry is a wm::Error.
  LayerKv layer(ChunkKey key, int l);
  // Every layer (as layer()).
  ChunkKv get(ChunkKey key);

  // Removes an entry (all its layers); false when it was not there. Counts as invalidated.
  bool erase(ChunkKey key);
  // A spill file of this entry was found damaged: the entry is erased (never to be used), the
  // event counted and its message kept (corrupt_reports()).
  void report_corrupt(ChunkKey key, const std::string& what);
  const std::vector<std::string>& corrupt_reports() const { return reports_; }

  // Keys of every entry (any order).
  std::vector<ChunkKey> keys() const;
  size_t size() const { return entries_.size(); }
  // Bytes the store holds in a tier.
  size_t bytes(Tier t) const { return store_->bytes(t); }
  BlockStore& store() { return *store_; }
  const ChunkCacheStats& stats() const { return stats_; }
  const ChunkCacheConfig& config() const { return cfg_; }
  LlmModelImpl& model() { return *model_; }
  int n_layers() const { return n_layers_; }

 private:
  struct Info {
    int64_t tokens = 0;
    int64_t first_position = 0;
    std::string kind;
    at::Tensor signature;
  };
  const Info& info(ChunkKey key) const;
  // Brings the entry in from the remote store; false when it is not there whole.
  bool from_remote(ChunkKey key) const;

  LlmModel model_;
  ChunkCacheConfig cfg_;
  uint64_t model_key_ = 0;
  int n_layers_ = 0;
  std::unique_ptr<BlockStore> store_;
  // Mutable: a const lookup may fill them from the remote store.
  mutable std::unordered_map<ChunkKey, Info> entries_;
  mutable ChunkCacheStats stats_;
  std::vector<std::string> reports_;
};

// A key as 16 hex digits.
std::string key_hex(ChunkKey key);

}  // namespace wm::llm
