#pragma once
// The text path's memory policies: classes of the core's MemoryPolicy, one per file in
// llmkv/policies/, registered by name in policies/registry.cpp. The decoder appends each forward
// step's K/V to the window itself; after every step (a prefill chunk, a decoded token) the
// session asks the policy to observe() it, with what its step_needs() asked the step to capture
// (the attention mass the keys received, the last query), and applies the plan: which tokens each layer keeps, which it re-anchors.
//
// Budgets are in KV tokens per layer, checked after each step (a step may overshoot the budget
// by its own tokens while it runs). Most policies choose one token set per layer, the kv heads'
// scores summed; snapkv, pyramidkv, adakv, keepkv and keepkv_ev choose per kv head
// (KvWindow::keep_tokens_per_head): their budget is what each head sees, and the window holds
// the union of the heads' tokens.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/memory.h"

namespace wm::llm {

// Embeds token sequences (evoke's relevance "embedding"): n sequences -> [n, d] float32, rows of
// unit norm (llmkv/sentence_encoder.h: sentence_embedder()).
using TextEmbedder = std::function<at::Tensor(const std::vector<std::vector<int64_t>>& texts)>;

struct TextMemoryConfig {
  std::string policy = "full";  // a registered name (text_policy_names())
  int64_t budget = 0;           // KV tokens per layer after each step; 0 only for "full"
  int64_t slack = 0;            // recency, streaming_llm, h2o, keepkv: a layer over budget is cut to
                                // budget - slack, so that eviction (a compaction of the layer)
                                // runs once per slack + 1 steps instead of every step
  int64_t sink = 4;             // streaming_llm: the first tokens, always kept
  int64_t recent = 0;           // h2o, keepkv: the last tokens always kept (0: h2o half the budget,
                                // keepkv a quarter)
  double score_decay = 0.9;     // keepkv: the attention scores' moving-average decay, in (0, 1)
  int64_t score_window = 32;    // keepkv: a step's attention scores come from its last score_window
                                // queries (at the end of a prompt, SnapKV's observation window);
                                // 0: from all of them (H2O's accumulation)
  bool prompt_restart = true;   // keepkv: a step of more than one token restarts the scores from its
                                // own attention instead of adding to the moving average
  int64_t score_kernel = 7;     // keepkv: max-pooling width over the scores before the choice
                                // (odd; 1: none, KeepKV as published)
  int64_t refresh_every = 0;    // keepkv: every this many steps the window is rebuilt from the full
                                // KV (the original entries merges replaced go to the bank); 0: never
  int64_t window = 32;          // snapkv, pyramidkv: the observation window (last prompt queries)
  int64_t kernel = 7;           // snapkv, pyramidkv: max-pooling width over the votes (odd)
  double pyramid_beta = 20.0;   // pyramidkv: the top layer keeps budget / beta (at least window + 1)
  double adakv_floor = 0.2;     // adakv: each kv head keeps at least this share of an even split of
                                // the layer's budget (AdaKV's alpha), in [0, 1]
  std::string recovery = "restore";  // evoke: "restore" (bank and bring back), "discard", or
                                     // "breadcrumb" (gone, a short text stub in its place)
  std::string placement = "original";  // evoke: a restored block at its "original" positions, at
                                       // the "tail" (re-anchored after everything), or "compact":
                                       // every block re-anchored so that the window's positions
                                       // run 0, 1, ... in the blocks' first order, gaps closed
                                       // (as StreamingLLM re-anchors its cache)
  std::string relevance = "attention";  // evoke: how blocks are scored against a message: "attention"
                                       // (the message's queries against the block's keys at
                                       // relevance_layer: the best match), "hidden" (cosine of the model's mean
                                       // last-layer hidden states) or "embedding" (cosine of
                                       // sentence embeddings of the texts: needs `embedder`)
  TextEmbedder embedder;               // evoke with relevance "embedding"
  int relevance_layer = -1;          // evoke: the layer whose query-key scores rank blocks (-1: last)
  int64_t recall_blocks = 0;         // evoke: banked blocks restored per message at most (0: what fits)
  int64_t message_blocks = 0;        // evoke: blocks of region "blocks" the window holds for a message
                                     // at most (the block before it first, then the most relevant,
                                     // kept or restored); the others leave (0: what fits)
  double relevance_margin = -1.0;    // evoke: >= 0: for a message, only blocks whose relevance is
                                     // within this of the most relevant block's stay or come back
                                     // (the block before the message always); < 0: no margin
  int64_t reserve = 4;               // evoke: tokens kept free for the message's answer
  int64_t sink_blocks = 0;           // evoke: the first blocks to arrive never leave (attention sinks)
  std::map<std::string, int64_t> kind_floors;  // evoke: per block kind (BlockMeta::kind), the most
                                               // recently used blocks of it that never leave
  // Throws wm::Error naming the field; the policy's own needs are checked when it is made.
  void validate() const;
};

class TextPolicy : public MemoryPolicy {
 public:
  explicit TextPolicy(TextMemoryConfig cfg) : cfg_(std::move(cfg)) {}
  const TextMemoryConfig& config() const { return cfg_; }
  const std::string& name() const { return cfg_.policy; }

  // The session lays out its own regions; text policies work on tokens, whatever the region.
  std::vector<std::string> regions() const override { return {"system", "blocks", "recent"}; }
  MemoryPlan prepare(const KvMemory&, const BlockMeta&) override { return {}; }
  MemoryPlan admit(const KvMemory&, Block block) override { return MemoryPlan().insert("blocks", std::move(block)); }

  // The position the next token takes, given the one it would take with nothing re-anchored.
  virtual int64_t next_position(const KvWindow& window, int64_t next) const {
    (void)window;
    return next;
  }
  // Where a layer over budget is cut to: budget - slack.
  int64_t evict_to() const { return cfg_.budget - cfg_.slack; }
  // Forgets per-token state (the session's context was emptied).
  virtual void reset() {}

  // Whether context should arrive as named blocks: one segment per block (a turn, a document,
  // a fact) in region "blocks", as LlmSession::predict's pieces and feed(ids, region, segment)
  // give it.
  virtual bool block_wise() const { return false; }
  // Before a new user message the session probes it (a forward pass over the message that
  // appends nothing; the probe's last query per layer in the view) when wants_recall(), and
  // applies recall()'s plan before feeding the message: what to bring back for it.
  virtual bool wants_recall() const { return false; }
  // Blocks the policy has moved out of the window, and brought back, since the last reset().
  virtual int64_t evictions() const { return 0; }
  virtual int64_t recoveries() const { return 0; }
  virtual MemoryPlan recall(const KvMemory& memory, const StepView& probe) {
    (void)memory, (void)probe;
    return {};
  }
  // Recovery "breadcrumb": short texts standing for blocks the policy dropped, {segment id,
  // text}, for the session to feed (region "blocks", a segment each) before the next piece of
  // context. Handing them over clears them.
  virtual std::vector<std::pair<std::string, std::string>> take_breadcrumbs() { return {}; }

  // Session snapshots (LlmSession::snapshot): what the policy keeps beyond the window and the
  // bank, which the session saves itself. A stateless policy (its choices follow from the window
  // alone) saves nothing. save_state() throws wm::Error for a policy whose state a snapshot does
  // not hold yet; load_state() takes what save_state() gave, with the memory already restored,
  // and throws wm::CorruptData when the state does not fit it.
  virtual bool stateless() const { return false; }
  virtual nlohmann::json save_state() const;
  virtual void load_state(const nlohmann::json& state, const KvMemory& memory);

 protected:
  TextMemoryConfig cfg_;
};

// The policy cfg.policy names. Throws wm::Error listing the registered names if none is, or if
// cfg does not suit it (a budget too small for its sinks or window, ...).
std::unique_ptr<TextPolicy> make_text_policy(const TextMemoryConfig& cfg);
// The registered names, in the registry's order.
std::vector<std::string> text_policy_names();

// Shared by the policies: the indices [0, n) of layer l that remain when the top `k` of
// `scores` (a float tensor [m], m <= n, over tokens [0, m)) join the tokens [n - recent, n);
// strictly increasing. Ties go to the earlier token.
std::vector<int64_t> keep_top_and_recent(const at::Tensor& scores, int64_t k, int64_t n, int64_t recent);

// PyramidKV's per-layer budgets: from the bottom layer to the top an arithmetic sequence whose
// top is max(floor, budget / beta) and whose sum is n_layers * budget exactly (the lower layers
// take the rounding); equal budgets when that top is not below the budget.
std::vector<int64_t> pyramid_budgets(int64_t budget, int n_layers, double beta, int64_t floor);

}  // namespace wm::llm
