// evoke: EVOKE's reversible eviction. Context arrives as named blocks (segments of region
// "blocks": a turn, a document, a fact). When the window holds more than the budget, the
// least recently used blocks leave it, oldest first (the block being written stays, and so does
// region "system", which is never evicted): into the bank with recovery "restore", gone with "discard"
// (evoke_discard). Before each new user message the message is probed and every block, in the
// window or banked, is scored by its relevance to it: the probe's last query against the
// block's keys at one layer (the largest scaled dot product, summed over the kv heads). The most
// relevant blocks that fit the budget (less the message and `reserve` tokens for its answer)
// are the window's: banked ones come back without recompute, re-anchored to the tail by one
// RoPE rotation (placement "tail") or at their original positions ("original"), and the others
// make room for them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "llmkv/text_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class Evoke final : public TextPolicy {
 public:
  Evoke(const TextMemoryConfig& cfg, bool discard) : TextPolicy(cfg), discard_(discard || cfg.recovery == "discard") {
    WM_CHECK(cfg.budget > cfg.reserve, name(), " needs a KV budget above its ", cfg.reserve,
             " reserved answer tokens, got ", cfg.budget);
  }

  bool block_wise() const override { return true; }
  bool wants_recall() const override { return !discard_; }
  StepNeeds step_needs() const override { return {}; }

  MemoryPlan observe(const KvMemory& memory, const StepView&) override {
    const KvWindow& w = memory.window();
    touch_new(w);
    MemoryPlan plan;
    int64_t size = w.size(0);
    if (size <= cfg_.budget) return plan;
    // Oldest use first.
    std::vector<std::pair<int64_t, std::string>> order;
    for (const auto& id : evictable(w)) order.push_back({used_.at(id), id});
    std::sort(order.begin(), order.end());
    for (const auto& [when, id] : order) {
      if (size <= cfg_.budget) break;
      size -= w.layout().segment_len(0, id);
      evict(w, id, plan);
    }
    return plan;
  }

  MemoryPlan recall(const KvMemory& memory, const StepView& probe) override {
    const KvWindow& w = memory.window();
    touch_new(w);
    MemoryPlan plan;
    if (banked_.empty()) return plan;
    const int L = w.spec().n_layers;
    const int layer = cfg_.relevance_layer < 0 ? L + cfg_.relevance_layer : cfg_.relevance_layer;
    WM_CHECK(layer >= 0 && layer < L, "relevance layer ", cfg_.relevance_layer, " outside the model's ", L);
    WM_CHECK(static_cast<int>(probe.query.size()) == L, name(), " needs the probe's query at every layer");
    const at::Tensor q = probe.query[layer].to(at::kCPU, at::kFloat);  // [KH, d]
    const double scale = 1.0 / std::sqrt(static_cast<double>(w.spec().head_dim));
    auto relevance = [&](const at::Tensor& k) {  // k [KH, n, d] -> sum over heads of the best key
      return (k.to(at::kCPU, at::kFloat).matmul(q.unsqueeze(-1)).squeeze(-1) * scale).amax(1).sum().item<double>();
    };
    // Candidates: the window's evictable blocks and the banked ones.
    struct Cand {
      std::string id;
      double rel;
      int64_t len;
      bool banked;
    };
    std::vector<Cand> cands;
    int64_t fixed = w.size(0);
    // The block before the message (the one holding the window's last token) comes first when
    // it fits: it is what the message answers.
    for (const auto& id : evictable(w, true)) {
      const int64_t b = w.layout().segment_begin(layer, id), n = w.layout().segment_len(layer, id);
      const double rel = id == last_block(w) ? std::numeric_limits<double>::infinity()
                                             : relevance(w.k(layer).narrow(1, b, n));
      cands.push_back({id, rel, w.layout().segment_len(0, id), false});
      fixed -= w.layout().segment_len(0, id);
    }
    for (const auto& [id, b] : banked_) cands.push_back({id, relevance(b.keys), b.len, true});
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.rel > b.rel; });
    int64_t room = cfg_.budget - fixed - probe.fresh - cfg_.reserve;
    int64_t restored = 0;
    std::vector<std::string> leave, back;
    for (const auto& c : cands) {
      const bool fits = c.len <= room && (!c.banked || cfg_.recall_blocks == 0 || restored < cfg_.recall_blocks);
      if (fits) {
        room -= c.len;
        if (c.banked) back.push_back(c.id), ++restored;
        used_[c.id] = ++clock_;  // relevant now: evicted last
      } else if (!c.banked) {
        leave.push_back(c.id);
      }
    }
    for (const auto& id : leave) evict(w, id, plan);
    // The next free position: after everything the window holds (restored blocks go there).
    int64_t next = next_position(w, 0);
    for (const auto& id : back) {
      const Banked& b = banked_.at(id);
      if (cfg_.placement == "tail") {
        plan.fetch(id, "blocks", Reanchor{0, next - b.first});
        next += b.span;
      } else {
        plan.fetch(id, "blocks");
      }
      banked_.erase(id);
      ++recoveries_;
    }
    return plan;
  }

  int64_t next_position(const KvWindow& w, int64_t next) const override {
    int64_t top = next;
    for (int l = 0; l < w.spec().n_layers; ++l)
      if (w.size(l) > 0) top = std::max(top, w.pos(l).select(1, 0).max().item<int64_t>() + 1);
    return top;
  }

  int64_t evictions() const override { return evictions_; }
  int64_t recoveries() const override { return recoveries_; }

  void reset() override {
    banked_.clear();
    used_.clear();
    clock_ = evictions_ = recoveries_ = 0;
  }

 private:
  struct Banked {
    at::Tensor keys;     // [KH, n, d] at the relevance layer, CPU float32
    int64_t len = 0;     // tokens (layer 0)
    int64_t first = 0;   // its first position when banked
    int64_t span = 0;    // last position - first + 1
  };

  // The block of region "blocks" holding the window's last token (being written), or "".
  static std::string last_block(const KvWindow& w) {
    const int64_t last = w.size(0) - 1;
    for (const auto& s : w.layout().segments(w.layout().region("blocks"))) {
      const int64_t b = w.layout().segment_begin(0, s.id), n = w.layout().segment_len(0, s.id);
      if (n > 0 && b <= last && last < b + n) return s.id;
    }
    return "";
  }

  // Blocks that may leave: region "blocks" (never "system"), the one being written only when
  // with_last (before a new message, when nothing is being written).
  std::vector<std::string> evictable(const KvWindow& w, bool with_last = false) const {
    std::vector<std::string> out;
    const std::string last = with_last ? "" : last_block(w);
    for (const auto& s : w.layout().segments(w.layout().region("blocks")))
      if (w.layout().segment_len(0, s.id) > 0 && s.id != last) out.push_back(s.id);
    return out;
  }

  // Stamps blocks seen for the first time (use order).
  void touch_new(const KvWindow& w) {
    for (const auto& s : w.layout().segments(w.layout().region("blocks")))
      if (!used_.count(s.id)) used_[s.id] = ++clock_;
  }

  void evict(const KvWindow& w, const std::string& id, MemoryPlan& plan) {
    ++evictions_;
    if (discard_) {
      plan.drop(id);
      return;
    }
    const int L = w.spec().n_layers;
    const int layer = cfg_.relevance_layer < 0 ? L + cfg_.relevance_layer : cfg_.relevance_layer;
    const int64_t b = w.layout().segment_begin(layer, id), n = w.layout().segment_len(layer, id);
    Banked bk;
    bk.keys = w.k(layer).narrow(1, b, n).to(at::kCPU, at::kFloat).clone();
    bk.len = w.layout().segment_len(0, id);
    const at::Tensor pos = w.pos(0).narrow(0, w.layout().segment_begin(0, id), bk.len).select(1, 0);
    bk.first = pos.min().item<int64_t>();
    bk.span = pos.max().item<int64_t>() - bk.first + 1;
    banked_[id] = std::move(bk);
    plan.bank(id);
  }

  bool discard_;
  std::map<std::string, Banked> banked_;
  std::map<std::string, int64_t> used_;  // per block: when it was last placed or found relevant
  int64_t clock_ = 0;
  int64_t evictions_ = 0, recoveries_ = 0;
};

}  // namespace

std::unique_ptr<TextPolicy> make_evoke(const TextMemoryConfig& cfg) { return std::make_unique<Evoke>(cfg, false); }
std::unique_ptr<TextPolicy> make_evoke_discard(const TextMemoryConfig& cfg) {
  return std::make_unique<Evoke>(cfg, true);
}

}  // namespace wm::llm
