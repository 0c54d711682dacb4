#pragma once
// The memory-policy interface of the KV-memory core, after llama.cpp's llama_memory_i and its
// memory context. The memory is the window and the bank (KvMemory). A policy reads them and
// prepares a plan: which blocks leave the window (dropped, or banked through a transform such
// as compression), which come back from the bank into a region (re-anchored or not), and where
// a new block goes. KvMemory::apply() carries a plan out; it is the only way the window's
// contents and the bank change. Policies belong to their path (video chunks and camera poses,
// text turns and files), which registers them by name; this interface knows blocks, regions
// and ids. One step of a client:
//
//   memory.apply(policy.prepare(memory, meta of the next block))  // bring back what it needs
//   ... the model computes the next block, attending to memory.window() ...
//   memory.apply(policy.admit(memory, the new block))             // place it, make room
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/block.h"
#include "runtime/block_store.h"
#include "runtime/kv_spec.h"
#include "runtime/window.h"

namespace wm {

// One step of a plan.
struct MemoryOp {
  enum class Kind {
    Drop,    // remove block `id` from the window; gone (a copy in the bank stays there)
    Bank,    // remove block `id` from the window into the bank's device tier, through `transform`
    Fetch,   // copy block `id` from the bank to the end of `region`, moved by `reanchor`; the bank keeps it
    Insert,  // put `block`, a new one, at the end of `region`
    Keep,    // keep only tokens `tokens` of layer `layer` (token eviction, any region); with
             // `head_tokens`, each kv head its own (KvWindow::keep_tokens_per_head)
    Shift,   // move tokens [begin, begin + count) of layer `layer` by `reanchor`
    Write,   // overwrite K/V/log-weights of tokens `tokens` of layer `layer` (merged entries); with
             // `head` >= 0, of that kv head only (KvWindow::write_head_tokens)
    Move,    // move segment `id` (every layer) by `reanchor`: positions shifted, keys rotated
    Store,   // put `block`, made by the policy, into the bank's tier `tier`; the window unchanged
    Tag,     // set segment `id`'s metadata to block.meta (kind, priority, pinned, ...); an absent
             // segment is made, empty, at the end of `region` (if one is given)
  };
  Kind kind = Kind::Drop;
  std::string id;                                   // Insert: block.id
  std::string region;                               // Fetch, Insert, Tag
  std::optional<Reanchor> reanchor;                 // Fetch, Shift, Move
  std::function<Block(const Block&)> transform;     // Bank: the block the bank keeps instead (may be empty)
  Block block;                                      // Insert, Store; Tag: its meta
  Tier tier = Tier::Host;                           // Store
  int layer = 0;                                    // Keep, Shift, Write
  int head = -1;                                    // Write: one kv head (k, v [1, m, head_dim]) or all (-1)
  std::vector<int64_t> tokens;                      // Keep: layer coordinates, strictly increasing; Write: distinct
  std::vector<std::vector<int64_t>> head_tokens;    // Keep per head: one such list per kv head (tokens unused)
  int64_t begin = 0, count = 0;                     // Shift
  at::Tensor k, v, logw;                            // Write: [n_kv_heads, m, head_dim] twice, [m]
  at::Tensor pos;                                   // Write: [m, n_axes] new positions, or undefined
};

// Ops, carried out in order. The builders append one op and return the plan.
struct MemoryPlan {
  std::vector<MemoryOp> ops;

  MemoryPlan& drop(std::string id);
  MemoryPlan& bank(std::string id, std::function<Block(const Block&)> transform = {});
  MemoryPlan& fetch(std::string id, std::string region, std::optional<Reanchor> reanchor = std::nullopt);
  MemoryPlan& insert(std::string region, Block block);
  MemoryPlan& keep(int layer, std::vector<int64_t> tokens);
  MemoryPlan& keep_per_head(int layer, std::vector<std::vector<int64_t>> head_tokens);
  MemoryPlan& shift(int layer, int64_t begin, int64_t count, Reanchor reanchor);
  MemoryPlan& write(int layer, std::vector<int64_t> tokens, at::Tensor k, at::Tensor v, at::Tensor logw,
                    at::Tensor pos = {});
  MemoryPlan& write_head(int layer, int head, std::vector<int64_t> tokens, at::Tensor k, at::Tensor v,
                         at::Tensor logw);
  MemoryPlan& move(std::string id, Reanchor reanchor);
  MemoryPlan& store(Block block, Tier tier = Tier::Host);
  MemoryPlan& tag(std::string id, BlockMeta meta, std::string region = "");
  bool empty() const { return ops.empty(); }
};

// The window and the bank of one client.
class KvMemory {
 public:
  // A window of `regions` (in order) over `spec`, empty, and a bank on spec.device with the
  // tiers and budgets of `bank` (its device is overridden). Throws wm::Error on a bad spec or
  // region list.
  KvMemory(KvSpec spec, std::vector<std::string> regions, StoreConfig bank);

  const KvSpec& spec() const { return window_->spec(); }
  const KvWindow& window() const { return *window_; }
  // The window for what leaves its contents alone: reserve(), stage() of the current tokens,
  // views for attention. Its contents change through apply() only.
  KvWindow& window() { return *window_; }
  const BlockStore& bank() const { return *bank_; }

  // Carries out the plan's ops in order. Throws wm::Error naming the op and block when one
  // fails (an absent block, a region unknown to the window, a bank with no room); the ops
  // before it stay applied. One exception: a fetch of a block that the bank's remote tier can no
  // longer give back (wm::LostData: expired, evicted, unreachable) is skipped and counted, the
  // block left in the bank (a later fetch may find the store back): the window goes on without it.
  void apply(MemoryPlan plan);
  // Empties the window and the bank.
  void clear();
  // Fetches skipped because the remote tier lost their block, and the last one's message.
  int64_t lost_fetches() const { return lost_fetches_; }
  const std::string& last_lost() const { return last_lost_; }

 private:
  std::unique_ptr<KvWindow> window_;
  std::unique_ptr<BlockStore> bank_;
  int64_t lost_fetches_ = 0;
  std::string last_lost_;
};

// What a policy asks a forward step to capture for observe().
struct StepNeeds {
  bool key_mass = false;     // the attention mass each window key received
  int64_t mass_queries = 0;  // ... from the step's last mass_queries queries only (0: from all)
  bool query = false;        // the step's last query
  bool hidden = false;       // the step's output hidden states (the model's last layer)
};

// What a forward step (its tokens already appended to the window) shows the policy.
struct StepView {
  int64_t fresh = 0;                  // the step's token count (the window's last tokens)
  std::string segment;                // the segment its tokens went to (or would have: a probe)
  at::Tensor tokens;                  // [fresh] int64 CPU: its input ids, where the path has them
  at::Tensor hidden;                  // [fresh, hidden] float32: the last layer's output, if asked
  std::vector<at::Tensor> key_mass;   // per layer [n_kv_heads, size] float32, if asked
  std::vector<at::Tensor> query;      // per layer [n_kv_heads, head_dim] float32: the last query,
                                      // rotated, its group's query heads averaged, if asked
  std::vector<at::Tensor> queries;    // per layer [n_kv_heads, fresh, head_dim]: every query so (a
                                      // recall probe's)
};

// A memory policy: prepares plans, never mutates the memory itself. Implementations are small
// classes of their path, built by name from the path's registry.
class MemoryPolicy {
 public:
  virtual ~MemoryPolicy() = default;

  // The window's regions, in order, as this policy lays them out (the memory is built with them).
  virtual std::vector<std::string> regions() const = 0;
  // The plan before the next block is computed, `next` describing it (its step and the path's
  // payload: the video path's camera pose): what to bring into the window, what to take out.
  virtual MemoryPlan prepare(const KvMemory& memory, const BlockMeta& next) = 0;
  // The plan for a new block (metadata filled in by its path): where it goes and what leaves
  // the window to make room. The plan takes the block (MemoryPlan::insert).
  virtual MemoryPlan admit(const KvMemory& memory, Block block) = 0;

  // Paths whose model appends its tokens' K/V to the window itself (the text path's decoder)
  // call observe() after each forward step instead of admit(), with what step_needs() asked
  // the step to capture. The plan makes room (Keep, Shift, Write, Drop, Bank).
  virtual StepNeeds step_needs() const { return {}; }
  virtual MemoryPlan observe(const KvMemory& memory, const StepView& step) {
    (void)memory, (void)step;
    return {};
  }
};

}  // namespace wm
