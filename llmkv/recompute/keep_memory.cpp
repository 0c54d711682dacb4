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
  Segments sg;
  sg.key.assign(prompt.size(), 0);
  std::set<ChunkKey> in_use;
  for (size_t s = 0; s < prompt.size(); ++s) {
    if (!prompt[s].reusable || prompt[s].ids.empty()) continue;
    WM_CHECK(!sg.of_slot.count(prompt[s].slot), "slot '", prompt[s].slot, "' fills two segments of the prompt");
    sg.of_slot[prompt[s].slot] = static_cast<int>(s);
    sg.seg.push_back(static_cast<int>(s));
    sg.key[s] = cache.chunk_key(prompt[s].ids);
    in_use.insert(sg.key[s]);
  }
  update_slots(prompt, sg, in_use, cache);
  keep_groups(sg, in_use, cache);
  sg.group_at.assign(prompt.size(), -1);
  sg.in_group.assign(prompt.size(), 0);
  for (size_t gi = 0; gi < groups_.size(); ++gi) sg.mark(groups_[gi], static_cast<int>(gi));
  if (grouping_) form_groups(prompt, sg, cache);
  return units(segment_offsets(prompt), sg, cache);
}

void KeepMemory::Segments::mark(const Group& g, int gi) {
  for (const auto& slot : g.slots) {
    const int s = of_slot.at(slot);
    group_at[s] = gi;
    in_group[s] = 1;
  }
}

void KeepMemory::update_slots(const std::vector<PromptSegment>& prompt, const Segments& sg,
                              const std::set<ChunkKey>& in_use, ChunkCache& cache) {
  for (int s : sg.seg) {
    auto it = slots_.find(prompt[s].slot);
    if (it == slots_.end()) {
      slots_[prompt[s].slot] = {sg.key[s], step_};
    } else if (it->second.key != sg.key[s]) {
      if (!in_use.count(it->second.key)) cache.erase(it->second.key);
      it->second = {sg.key[s], step_};
    }
  }
}

void KeepMemory::keep_groups(const Segments& sg, const std::set<ChunkKey>& in_use, ChunkCache& cache) {
  std::vector<Group> kept;
  for (auto& g : groups_) {
    bool ok = true;
    int prev = -1;
    for (size_t i = 0; i < g.slots.size() && ok; ++i) {
      auto it = sg.of_slot.find(g.slots[i]);
      ok = it != sg.of_slot.end() && sg.key[it->second] == g.members[i] && (prev < 0 || it->second == prev + 1);
      if (ok) prev = it->second;
    }
    if (ok) {
      kept.push_back(std::move(g));
    } else if (!in_use.count(g.key)) {
      cache.erase(g.key);
    }
  }
  groups_ = std::move(kept);
}

void KeepMemory::form_groups(const std::vector<PromptSegment>& prompt, Segments& sg, ChunkCache& cache) {
  auto is_static = [&](int s) { return step_ - slots_.at(prompt[s].slot).since >= static_after_; };
  Group cur;
  at::Tensor mean;  // the current group's mean signature (unnormalised sum)
  int64_t cur_tokens = 0;
  int prev = -2;
  auto close = [&] {
    if (cur.slots.size() >= 2) {
      cur.key = cache.chunk_key(cur.ids);
      sg.mark(cur, static_cast<int>(groups_.size()));
      groups_.push_back(cur);
    }
    cur = Group{};
    mean = at::Tensor();
    cur_tokens = 0;
  };
  for (int s : sg.seg) {
    at::Tensor sig;
    if (!sg.in_group[s] && is_static(s) && cache.contains(sg.key[s])) sig = cache.signature(sg.key[s]);
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
    cur.members.push_back(sg.key[s]);
    cur.ids.insert(cur.ids.end(), prompt[s].ids.begin(), prompt[s].ids.end());
    mean = mean.defined() ? mean + sig : sig.clone();
    cur_tokens += n;
    prev = s;
  }
  close();
}

KeepMemory::Construction KeepMemory::units(const std::vector<int64_t>& off, const Segments& sg,
                                           const ChunkCache& cache) const {
  auto unit = [&](int first, int last, ChunkKey key, const char* kind) {
    CacheUnit u;
    u.first = first;
    u.last = last;
    u.begin = off[first];
    u.end = off[last];
    u.key = key;
    u.kind = kind;
    u.exact = u.begin == 0;
    return u;
  };
  Construction out;
  for (size_t i = 0; i < sg.seg.size();) {
    const int s = sg.seg[i];
    const int gi = sg.group_at[s];
    if (gi >= 0) {
      const Group& g = groups_[gi];
      const int first = sg.of_slot.at(g.slots.front()), last = sg.of_slot.at(g.slots.back()) + 1;
      if (first == s && cache.contains(g.key)) {
        out.units.push_back(unit(first, last, g.key, "group"));
        i += g.slots.size();
        continue;
      }
      if (first == s) out.builds.push_back({g.key, "group", g.ids});
    }
    out.units.push_back(unit(s, s + 1, sg.key[s], "chunk"));
    ++i;
  }
  return out;
}

}  // namespace wm::llm
