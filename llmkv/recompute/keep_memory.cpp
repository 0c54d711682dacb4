#include "llmkv/recompute/keep_memory.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "runtime/error.h"

namespace wm::llm {

KeepMemory::KeepMemory(int static_after, double similarity, int64_t max_group_tokens, bool grouping)
    : static_after_(static_after), similarity_(similarity), max_group_tokens_(max_group_tokens), grouping_(grouping) {
  WM_CHECK(static_after >= 1, "static_after must be >= 1, got ", static_after);
  WM_CHECK(max_group_tokens >= 1, "max_group_tokens must be >= 1, got ", max_group_tokens);
}

void KeepMemory::reset() {
  step_ = 0;
  slots_.clear();
  groups_.clear();
}

std::vector<std::vector<std::string>> KeepMemory::groups() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& g : groups_) out.push_back(g.slots);
  return out;
}

int64_t KeepMemory::age(const std::string& slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? -1 : step_ - it->second.since;
}

KeepMemory::Construction KeepMemory::construct(const std::vector<PromptSegment>& prompt, ChunkCache& cache) {
  ++step_;
  const std::vector<int64_t> off = segment_offsets(prompt);
  std::vector<int> seg;  // the reusable segments with tokens, in prompt order
  std::vector<ChunkKey> key(prompt.size(), 0);
  std::set<ChunkKey> in_use;
  std::unordered_map<std::string, int> seg_of_slot;
  for (size_t s = 0; s < prompt.size(); ++s) {
    if (!prompt[s].reusable || prompt[s].ids.empty()) continue;
    WM_CHECK(!seg_of_slot.count(prompt[s].slot), "slot '", prompt[s].slot, "' fills two segments of the prompt");
    seg_of_slot[prompt[s].slot] = static_cast<int>(s);
    seg.push_back(static_cast<int>(s));
    key[s] = cache.chunk_key(prompt[s].ids);
    in_use.insert(key[s]);
  }
  // Slots: a changed content restarts the slot's age and invalidates its old block.
  for (int s : seg) {
    auto it = slots_.find(prompt[s].slot);
    if (it == slots_.end()) {
      slots_[prompt[s].slot] = {key[s], step_};
    } else if (it->second.key != key[s]) {
      if (!in_use.count(it->second.key)) cache.erase(it->second.key);
      it->second = {key[s], step_};
    }
  }
  // Groups stay while their segments are unchanged and still consecutive in the prompt.
  std::vector<Group> kept;
  for (auto& g : groups_) {
    bool ok = true;
    int prev = -1;
    for (size_t i = 0; i < g.slots.size() && ok; ++i) {
      auto it = seg_of_slot.find(g.slots[i]);
      ok = it != seg_of_slot.end() && key[it->second] == g.members[i] && (prev < 0 || it->second == prev + 1);
      if (ok) prev = it->second;
    }
    if (ok) {
      kept.push_back(std::move(g));
    } else if (!in_use.count(g.key)) {
      cache.erase(g.key);
    }
  }
  groups_ = std::move(kept);
  std::vector<int> group_at(prompt.size(), -1);  // the group a segment starts or belongs to
  std::vector<char> in_group(prompt.size(), 0);
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const auto& slot : groups_[gi].slots) {
      const int s = seg_of_slot.at(slot);
      group_at[s] = static_cast<int>(gi);
      in_group[s] = 1;
    }
  // New groups among static segments in no group: consecutive runs split by similarity and size.
  if (grouping_) {
    auto is_static = [&](int s) { return step_ - slots_.at(prompt[s].slot).since >= static_after_; };
    Group cur;
    at::Tensor mean;  // the current group's mean signature (unnormalised sum)
    int64_t cur_tokens = 0;
    int prev = -2;
    auto close = [&] {
      if (cur.slots.size() >= 2) {
        cur.key = cache.chunk_key(cur.ids);
        const int gi = static_cast<int>(groups_.size());
        for (const auto& slot : cur.slots) {
          const int s = seg_of_slot.at(slot);
          group_at[s] = gi;
          in_group[s] = 1;
        }
        groups_.push_back(cur);
      }
      cur = Group{};
      mean = at::Tensor();
      cur_tokens = 0;
    };
    for (int s : seg) {
      at::Tensor sig;
      if (!in_group[s] && is_static(s) && cache.contains(key[s])) sig = cache.signature(key[s]);
      if (!sig.defined()) {
        close();
        prev = -2;
        continue;
      }
      const int64_t n = static_cast<int64_t>(prompt[s].ids.size());
      bool join = !cur.slots.empty() && s == prev + 1 && cur_tokens + n <= max_group_tokens_;
      if (join) {
        const double cos = at::cosine_similarity(mean.unsqueeze(0), sig.unsqueeze(0)).item<double>();
        join = cos >= similarity_;
      }
      if (!join) close();
      cur.slots.push_back(prompt[s].slot);
      cur.members.push_back(key[s]);
      cur.ids.insert(cur.ids.end(), prompt[s].ids.begin(), prompt[s].ids.end());
      mean = mean.defined() ? mean + sig : sig.clone();
      cur_tokens += n;
      prev = s;
    }
    close();
  }
  // Units: a group whose block exists is one unit; otherwise its segments go one by one (and
  // the block is built after the step).
  Construction out;
  for (size_t i = 0; i < seg.size();) {
    const int s = seg[i];
    const int gi = group_at[s];
    if (gi >= 0) {
      const Group& g = groups_[gi];
      const int first = seg_of_slot.at(g.slots.front()), last = seg_of_slot.at(g.slots.back()) + 1;
      if (first == s && cache.contains(g.key)) {
        CacheUnit u;
        u.first = first;
        u.last = last;
        u.begin = off[first];
        u.end = off[last];
        u.key = g.key;
        u.kind = "group";
        u.exact = u.begin == 0;
        out.units.push_back(u);
        i += g.slots.size();
        continue;
      }
      if (first == s) out.builds.push_back({g.key, "group", g.ids});
    }
    CacheUnit u;
    u.first = s;
    u.last = s + 1;
    u.begin = off[s];
    u.end = off[s + 1];
    u.key = key[s];
    u.kind = "chunk";
    u.exact = u.begin == 0;
    out.units.push_back(u);
    ++i;
  }
  return out;
}

}  // namespace wm::llm
