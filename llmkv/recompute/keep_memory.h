#pragma once
// KEEP's static-dynamic memory construction, over the planning steps of one episode. Every
// reusable segment of a prompt fills a slot ("rules", "mem:brass-key"); the memory remembers since
// which step each slot's content is unchanged. A slot unchanged for static_after steps is static.
// Consecutive static segments whose signatures (the mean hidden state of each computed alone,
// ChunkCache::signature) are similar, at least `similarity` in cosine to the group's mean, form a
// group of at most max_group_tokens, cached as one block prefilled as a whole: the attention among
// its segments is kept. The other segments are dynamic, cached one by one, so that an update
// invalidates only its own block: when a slot's content changes, its old entry is erased from the
// cache (unless another slot holds the same text), and a group holding it is dissolved (its entry
// erased, its segments dynamic again). A new group's block is built after the step that formed
// it (off that step's first token); until it exists its segments are used one by one.
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmkv/chunk_cache.h"
#include "llmkv/recompute/recompute_policy.h"

namespace wm::llm {

class KeepMemory {
 public:
  // grouping false: every segment stays dynamic (the no-grouping ablation). Throws wm::Error on
  // static_after < 1 or max_group_tokens < 1.
  KeepMemory(int static_after, double similarity, int64_t max_group_tokens, bool grouping);

  struct Construction {
    std::vector<CacheUnit> units;                 // for the plan, in prompt order
    std::vector<RecomputePlan::Build> builds;     // group blocks to build after the step
  };
  // The next step's units for `prompt` (one call per planning step). Erases stale entries from the
  // cache as described above.
  Construction construct(const std::vector<PromptSegment>& prompt, ChunkCache& cache);
  // A new episode: slots and groups forgotten (cache entries stay, found again by their keys).
  void reset();

  int64_t step() const { return step_; }
  // The groups, each its slots in prompt order (built or waiting to be).
  std::vector<std::vector<std::string>> groups() const;
  // Steps the slot's content has been unchanged (0 on the step it changed or appeared); -1 if unknown.
  int64_t age(const std::string& slot) const;

 private:
  struct Slot {
    ChunkKey key = 0;
    int64_t since = 0;  // the step its content last changed
  };
  struct Group {
    std::vector<std::string> slots;
    std::vector<ChunkKey> members;  // each slot's chunk key when the group formed
    ChunkKey key = 0;               // chunk key of the members' ids together
    std::vector<int64_t> ids;
  };
  // construct()'s view of the prompt: its reusable segments with tokens (in prompt order), each
  // segment's chunk key, the segment of each slot, and the group each segment belongs to.
  struct Segments {
    std::vector<int> seg;
    std::vector<ChunkKey> key;  // per prompt segment (0: not reusable)
    std::unordered_map<std::string, int> of_slot;
    std::vector<int> group_at;   // per prompt segment: its group's index, -1: none
    std::vector<char> in_group;
    void mark(const Group& g, int gi);  // g's segments belong to group gi
  };
  // construct()'s steps. A slot whose content changed restarts its age, and its old block goes
  // (unless another segment uses it).
  void update_slots(const std::vector<PromptSegment>& prompt, const Segments& sg, const std::set<ChunkKey>& in_use,
                    ChunkCache& cache);
  // Groups stay while their segments are unchanged and still consecutive in the prompt.
  void keep_groups(const Segments& sg, const std::set<ChunkKey>& in_use, ChunkCache& cache);
  // New groups among static segments in no group: consecutive runs split by similarity and size.
  void form_groups(const std::vector<PromptSegment>& prompt, Segments& sg, ChunkCache& cache);
  // The units: a group whose block exists is one unit; otherwise its segments go one by one
  // (and the block is built after the step). `off`: the segments' token offsets.
  Construction units(const std::vector<int64_t>& off, const Segments& sg, const ChunkCache& cache) const;

  int static_after_;
  double similarity_;
  int64_t max_group_tokens_;
  bool grouping_;
  int64_t step_ = 0;
  std::unordered_map<std::string, Slot> slots_;
  std::vector<Group> groups_;
};

}  // namespace wm::llm
