#pragma once
// Recompute policies: how a prompt whose context comes from a chunk KV cache (llmkv/chunk_cache.h)
// is computed. A prompt is a list of segments: reusable ones (rules, examples, memory lines: the
// context, whose K/V may come from the cache) and fresh ones (the goal, the past steps, the cue:
// computed every time). Before the prompt a policy prepares a plan (prepare): which cache entry
// supplies which run of segments, and how the rest is computed; the executor (blend.h) carries it
// out. When the plan asks, the executor then runs the model a layer at a time and, at the plan's
// check layers, asks the policy which of the reused tokens it recomputes from the next layer on
// (select): a token no longer recomputed at some layer is never recomputed again, so once a
// selection is made the K/V that later layers need from the cache are known (what KEEP's
// layer-balanced loading uses).
//
// Why not the core's MemoryPolicy (runtime/memory.h): its plans are ops on the window and the
// bank between forward steps (drop, bank, fetch, keep, write, ...), applied by KvMemory. A
// recompute decision is taken inside one forward pass, between layers, from what that pass has
// computed so far (hidden states, attention), and changes what is computed, not what is stored.
// The same idea, a plan prepared then applied by one executor, is kept, at two points: per prompt
// (prepare) and per check layer (select).
//
// Policies, by name (make_recompute_policy):
//   full_recompute    everything prefilled: the quality reference
//   prefix_cache      LMCache: the longest prefix of segments whose in-context K/V an earlier
//                     prompt stored (chained keys) is reused exactly; the rest is prefilled after it
//   full_reuse        every reusable segment from its own chunk entry, re-anchored; nothing
//                     recomputed (the attention between segments is lost)
//   cacheblend        CacheBlend: chunk entries re-anchored; the first layer is computed for every
//                     token, then at layer 1 the tokens whose fresh K/V deviate most from the cached
//                     ones are kept for recompute (2x ratio), the set shrinking over the next
//                     filter_layers layers to ratio (gradual filtering)
//   keep              KEEP: static-dynamic memory (keep_memory.h: segments unchanged for
//                     static_after steps are grouped by similarity and cached as one block), multi-hop
//                     selection of whole units at the check layers (multi_hop.h), layer-balanced
//                     loading; and every other reused unit's first head_tokens tokens recomputed
//   keep_no_grouping, keep_one_hop, keep_next_layer: keep without one of its three parts
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llmkv/chunk_cache.h"

namespace wm::llm {

// A segment of a prompt. `slot` names what it is about ("rules", "mem:brass-key"): the same slot
// holds a thing's line across planning steps, its text changing with the world. Reusable: its K/V
// may come from the cache; otherwise it is computed afresh every time.
struct PromptSegment {
  std::string slot;
  std::vector<int64_t> ids;
  bool reusable = true;
};

// A run of consecutive prompt segments whose K/V come from one cache entry.
struct CacheUnit {
  int first = 0, last = 0;     // segments [first, last)
  int64_t begin = 0, end = 0;  // prompt tokens [begin, end)
  ChunkKey key = 0;
  std::string kind;            // "chunk" (one segment alone), "group" (segments prefilled together),
                               // "prefix" (as an earlier prompt with the same prefix computed it)
  bool exact = false;          // the entry's K/V are this prompt's own (a prefix entry; an entry
                               // prefilled alone from position 0 placed at position 0): never recomputed
  int64_t n_tokens() const { return end - begin; }
};

// What a policy prepares for one prompt.
struct RecomputePlan {
  std::vector<CacheUnit> units;    // in prompt order, disjoint; tokens in none are computed afresh
  // true: the units are an exact prefix and the rest runs as one ordinary prefill after them
  // (full_recompute, prefix_cache). false: a layer at a time, select() at the check layers.
  bool prefill_rest = false;
  bool store_prefixes = false;     // afterwards, store each reusable segment's in-context K/V
                                   // under its prefix key (prefix_cache)
  std::vector<int> check_layers;   // increasing; select() is asked at each (the last layer never)
  bool cached_of_recomputed = false;  // also load the cached K/V of recomputed tokens (CacheBlend
                                      // compares them with the fresh ones)
  bool balanced_loading = false;   // the loader may run ahead to every later layer a selection has
                                   // fixed (else it loads the next layer only)
  // Entries to prefill and store after the prompt's first token, off its critical path, for
  // later prompts (KEEP's static groups): key, kind and the ids prefilled alone from position 0.
  struct Build {
    ChunkKey key = 0;
    std::string kind;
    std::vector<int64_t> ids;
  };
  std::vector<Build> build_after;
};

// What the executor shows a policy at a check layer (before the layer's attention).
class BlendLayer {
 public:
  virtual ~BlendLayer() = default;
  virtual int layer() const = 0;
  virtual int n_layers() const = 0;
  virtual int64_t n_prompt() const = 0;
  virtual const std::vector<CacheUnit>& units() const = 0;
  // Prompt indices of the reused tokens recomputed at this layer (their K/V computed now), increasing.
  virtual const std::vector<int64_t>& recomputed() const = 0;
  // Prompt indices of the tokens computed afresh (the query and anything in no unit), increasing.
  virtual const std::vector<int64_t>& fresh() const = 0;
  // The recomputed tokens' K/V at this layer, [n_kv_heads, n, head_dim] each (K rotated), in the
  // order of recomputed(): as computed now, and as the cache had them re-anchored to this prompt
  // (undefined unless the plan asked for cached_of_recomputed).
  virtual at::Tensor fresh_k() const = 0;
  virtual at::Tensor fresh_v() const = 0;
  virtual at::Tensor cached_k() const = 0;
  virtual at::Tensor cached_v() const = 0;
  // The attention each prompt token's key receives at this layer from each group of queries
  // (prompt indices of recomputed or fresh tokens; a query sees the keys up to itself), averaged
  // over the group's queries and the kv heads (each kv head's query heads averaged into one query:
  // causal_attention_rows in blend.h): [groups, n_prompt] float32 CPU, each row summing to 1 (a
  // zero row for an empty group). Throws wm::Error for a token with no query here.
  virtual at::Tensor attention_from(const std::vector<std::vector<int64_t>>& groups) const = 0;
};

struct RecomputeConfig {
  std::string policy = "full_recompute";  // a registered name (recompute_policy_names())
  double ratio = 0.15;       // cacheblend, keep: the share of the reused tokens recomputed, (0, 1]
  int filter_layers = 2;     // cacheblend: layers after its first over which 2x ratio shrinks to ratio
  std::vector<int> check_layers;  // keep: the layers where multi-hop selection runs (empty: layer
                                  // 1, or 0 in a 2-layer model); cacheblend: its first layer is
                                  // check_layers[0] when given (else 1)
  std::vector<double> check_ratios;  // keep: per check layer, a multiple of ratio selected there
                                     // (from the units still recomputed): uneven recompute over the
                                     // layers, e.g. {3, 1}; empty: 1 at every check layer
  int static_after = 10;     // keep: planning steps a segment must stay unchanged to become static
  double group_similarity = 0.9;  // keep: a static segment joins the group before it when the
                                  // cosine of its signature with the group's mean is at least this
  int64_t max_group_tokens = 512;  // keep: the most tokens one group holds
  int max_hops = 8;          // keep: multi-hop rounds at most (the set usually settles in 2-3)
  int head_tokens = 2;       // keep: the first head_tokens tokens of every reused unit not selected
                             // stay recomputed too (on top of ratio; 0: KEEP as published). A unit
                             // prefilled alone from position 0 makes its first tokens that
                             // prefill's attention sink, and re-anchored those K/V are the ones
                             // that differ most from the prompt's own (EPIC's observation)
  bool grouping = true;      // keep's parts; the ablations switch one off
  bool multi_hop = true;
  bool balanced_loading = true;
  // Throws wm::Error naming the field.
  void validate() const;
};

class RecomputePolicy {
 public:
  explicit RecomputePolicy(RecomputeConfig cfg) : cfg_(std::move(cfg)) {}
  virtual ~RecomputePolicy() = default;
  const std::string& name() const { return cfg_.policy; }
  const RecomputeConfig& config() const { return cfg_; }

  // The plan for the next prompt (one planning step; prompts come in order). Reads the cache
  // (which entries exist, their signatures) and may erase entries it knows to be stale (keep: the
  // old block of a segment that changed). The prompt's last segment must not be reusable.
  virtual RecomputePlan prepare(const std::vector<PromptSegment>& prompt, ChunkCache& cache) = 0;
  // At each check layer: the recomputed tokens that stay recomputed from the next layer on, a
  // subset of view.recomputed() (any order). By default all of them.
  virtual std::vector<int64_t> select(const BlendLayer& view) { return view.recomputed(); }
  // A new episode: per-step state forgotten.
  virtual void reset() {}

 protected:
  RecomputeConfig cfg_;
};

// The policy cfg.policy names (after cfg.validate()). Throws wm::Error listing the names if none is.
std::unique_ptr<RecomputePolicy> make_recompute_policy(const RecomputeConfig& cfg);
std::vector<std::string> recompute_policy_names();

// Shared by the policies. The prompt's segments' first token indices ([n_segments + 1]: the last
// is the prompt's length).
std::vector<int64_t> segment_offsets(const std::vector<PromptSegment>& prompt);
// One unit per reusable segment with tokens (kind "chunk", its chunk key; exact at position 0).
std::vector<CacheUnit> segment_units(const std::vector<PromptSegment>& prompt, const ChunkCache& cache);
// Throws wm::Error unless the prompt has tokens and ends with a fresh segment.
void check_prompt(const std::vector<PromptSegment>& prompt);

}  // namespace wm::llm
