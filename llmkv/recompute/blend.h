#pragma once
// The executor of recompute plans (recompute_policy.h): prefills a prompt whose reusable segments
// come from a chunk KV cache, into a window, and returns its last token's logits.
//
// With a layer-wise plan, per layer l, with x the hidden states of the tokens carried into l (the
// recomputed reused tokens and the fresh ones):
//   1. the loader (LayerQueueLoader) hands over the cache entries' layer-l K/V queued for l; they
//      are placed at their units' offsets, keys re-anchored (one RoPE rotation per token, by the
//      unit's offset);
//   2. the carried tokens' q, k, v are computed from x; their K/V replace the cached ones;
//   3. at a check layer the policy selects which recomputed tokens are carried on; the tokens it
//      drops will need the cache's K/V at every later layer, and those blocks are queued at once
//      (the loader loads them as soon as its lookahead allows: the next layer only, or, with
//      balanced loading, every later layer);
//   4. the carried tokens attend over the layer's K/V (each sees the prompt up to itself) and
//      pass through the layer's MLP.
// Layer 0's K/V depend on the token and its position only, so every reused token's are computed
// from its embedding (a projection) rather than loaded. A token carried through every layer gets
// exactly the K/V a full prefill computes: a plan that recomputes everything equals
// full_recompute.
//
// Missing entries are prefilled alone first (part of the time to the first token) and stored
// after it. A damaged spill file met while loading is reported (ChunkCache::report_corrupt) and
// the prompt starts over, the damaged entry now missing and so prefilled again: its K/V are never
// used.
#include <ATen/ATen.h>

#include <array>
#include <string>
#include <vector>

#include "llmkv/chunk_cache.h"
#include "llmkv/recompute/recompute_policy.h"
#include "runtime/window.h"

namespace wm::llm {

struct ReuseOptions {
  std::string region = "recent";  // where the prompt's K/V go in the window (segment "prompt")
  int max_attempts = 3;           // prompts started over after damaged entries, at most
  double load_bytes_per_s = 0;    // the loader's throughput cap (0: none; LayerQueueLoader)
};

struct ReuseStats {
  double ttft_s = 0.0;          // prompt in, its last token's logits out: look-ups, prefills of
                                // missing entries, loading and compute
  double store_s = 0.0;         // after that: storing new entries, building plan.build_after
  int64_t prompt_tokens = 0;
  int64_t memory_tokens = 0;    // tokens of reusable segments (the context)
  int64_t reused_tokens = 0;    // tokens in cache units
  int64_t fresh_tokens = 0;     // tokens computed afresh (the query, prefix misses, ...)
  int64_t prefilled_tokens = 0; // tokens of missing entries prefilled alone before the prompt
  int64_t units = 0, misses = 0;  // cache units of the plan, and those whose entry was missing
  int64_t recomputed_token_layers = 0;  // the memory's K/V computed at layers 1.. (recomputed, or
                                        // computed afresh for lack of an entry); layer 0's depend
                                        // on the token and position alone and are not counted
  int64_t computed_token_layers = 0;    // tokens through a layer's attention and MLP, any kind
  std::array<int64_t, kTiers> loaded_token_layers{};  // K/V read from the cache, tokens x layers, per tier
  std::vector<double> loader_idle_s;   // per layer: the loader idle while the model was at it
  std::vector<double> loader_stall_s;  // per layer: the model waiting for the loader
  std::vector<double> loader_busy_s;   // per layer: the loader loading while the model was at it
  size_t loaded_bytes = 0;
  int64_t corrupt = 0;          // damaged entries met (reported, recomputed)
  int attempts = 0;
  int n_layers = 0;
  // The share of the memory's K/V at layers 1.. that was computed rather than taken from the
  // cache (1 for full_recompute; 0 with no memory or a one-layer model).
  double recomputed_fraction() const;
};

struct ReuseResult {
  at::Tensor logits;  // [vocab] float32 CPU, at the prompt's last token
  ReuseStats stats;
};

// Prefills `prompt` (check_prompt) into `window` (emptied first; the model's KV spec, on its
// device) as `policy` plans it: K/V at positions 0..n-1 of region opt.region, segment "prompt",
// so that decoding goes on with LlmModelImpl::step at position n. Calls policy.prepare once.
// Throws wm::Error on a bad prompt or plan (a selection outside the recomputed tokens, units that
// overlap or leave the prompt, a layer-wise plan whose last token is not fresh), and
// wm::CorruptData when damaged entries persist over opt.max_attempts.
ReuseResult prefill_with_reuse(ChunkCache& cache, RecomputePolicy& policy, const std::vector<PromptSegment>& prompt,
                               KvWindow& window, const ReuseOptions& opt = {});

// The mass each of n keys (positions 0..n-1) receives from queries q [n_heads, m, head_dim] at
// prompt positions q_pos [m] (int64 CPU) over k [n_kv_heads, n, head_dim], causal: [m, n]
// float32 on q's device, rows summing to 1. For scoring (KEEP's importance), not for a layer's
// output: each kv head's group of query heads is averaged into one query first (as
// StepOptions::capture_query does), then the softmax per kv head, averaged over the kv heads.
at::Tensor causal_attention_rows(const at::Tensor& q, const at::Tensor& q_pos, const at::Tensor& k);

}  // namespace wm::llm
