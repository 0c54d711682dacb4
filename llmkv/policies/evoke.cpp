// evoke: EVOKE's reversible eviction. Context arrives as named blocks (segments of region
// "blocks": a turn, a document, a fact). When the window holds more than the budget, the
// lowest-scoring blocks leave it: the lowest priority first (BlockMeta::priority), then the least
// recently used. Some never leave: region "system", the block being written, pinned blocks, the
// first sink_blocks blocks to arrive, and per block kind the kind_floors[kind] most recently used
// of it. They go into the bank with recovery "restore", are gone with "discard" (evoke_discard). Before each new user message the message is probed and every block, in the
// window or banked, is scored by its relevance to it (TextMemoryConfig::relevance): the probe's
// queries against the block's keys at one layer (the largest scaled dot product of any of the
// message's queries with any of the block's keys, summed over the kv heads: "attention"), the
// cosine of the mean last-layer hidden states of the block and
// of the message ("hidden"), or the cosine of sentence embeddings of their texts
// ("embedding", the config's embedder). The most
// relevant blocks that fit the budget (less the message and `reserve` tokens for its answer)
// are the window's (at most `message_blocks` of them when that is set, the block before the
// message counted first, and with `relevance_margin` >= 0 only those within that margin of the
// most relevant: a window holding what the message needs and little else, since a small model
// reads a needle better among few blocks): banked ones come back without recompute, re-anchored to the tail by one
// RoPE rotation (placement "tail") or at their original positions ("original"), and the others
// make room for them. With placement "compact" every eviction and recall ends with the window
// re-anchored so that its positions run 0, 1, ... with no gaps, the blocks in the order they
// first arrived (a restored block between the ones around it then): the model never sees a
// position beyond the budget, however long the session.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "llmkv/text_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class Evoke final : public TextPolicy {
 public:
  Evoke(const TextMemoryConfig& cfg, const std::string& recovery)
      : TextPolicy(cfg), recovery_(recovery), discard_(recovery != "restore") {
    WM_CHECK(cfg.budget > cfg.reserve, name(), " needs a KV budget above its ", cfg.reserve,
             " reserved answer tokens, got ", cfg.budget);
    WM_CHECK(cfg.relevance != "embedding" || cfg.embedder, name(),
             " with relevance 'embedding' needs a sentence embedder (a sentence-embedding model folder)");
  }

  bool block_wise() const override { return true; }
  bool wants_recall() const override { return !discard_; }
  StepNeeds step_needs() const override {
    StepNeeds n;
    n.hidden = cfg_.relevance == "hidden";
    return n;
  }

  MemoryPlan observe(const KvMemory& memory, const StepView& step) override {
    const KvWindow& w = memory.window();
    touch_new(w);
    if (!discard_) describe(step);
    MemoryPlan plan;
    int64_t size = w.size(0);
    if (size <= cfg_.budget) return plan;
    // Lowest priority first, then the oldest use.
    std::vector<std::tuple<double, int64_t, std::string>> order;
    for (const auto& id : evictable(w)) order.push_back({w.meta(id).priority, used_.at(id), id});
    std::sort(order.begin(), order.end());
    std::set<std::string> leaving;
    for (const auto& [priority, when, id] : order) {
      if (size <= cfg_.budget) break;
      size -= w.layout().segment_len(0, id);
      evict(w, id, plan);
      leaving.insert(id);
    }
    if (compact_) compact(w, leaving, {}, plan);
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
    // The message's queries [KH, m, d]: all of them when the probe has them, else its last.
    const at::Tensor q = (static_cast<int>(probe.queries.size()) == L ? probe.queries[layer]
                                                                     : probe.query[layer].unsqueeze(1))
                             .to(at::kCPU, at::kFloat);
    const double scale = 1.0 / std::sqrt(static_cast<double>(w.spec().head_dim));
    auto by_keys = [&](const at::Tensor& k) {  // k [KH, n, d] -> sum over heads of the best query-key match
      return (k.to(at::kCPU, at::kFloat).matmul(q.transpose(1, 2)) * scale).amax({1, 2}).sum().item<double>();
    };
    // "hidden" and "embedding": the message's own vector, and the blocks' as described so far.
    at::Tensor message;
    if (cfg_.relevance == "hidden") {
      message = probe.hidden.to(at::kCPU, at::kDouble).mean(0);
      message = message / message.norm().clamp_min(1e-12);
    } else if (cfg_.relevance == "embedding") {
      message = embed_pending(probe.tokens);
    }
    auto relevance = [&](const std::string& id, const at::Tensor& keys) {
      if (cfg_.relevance == "attention") return by_keys(keys);
      const auto it = vec_.find(id);
      if (it == vec_.end() || !it->second.defined()) return -std::numeric_limits<double>::infinity();
      return at::dot(it->second, message).item<double>();
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
                                             : relevance(id, w.k(layer).narrow(1, b, n));
      cands.push_back({id, rel, w.layout().segment_len(0, id), false});
      fixed -= w.layout().segment_len(0, id);
    }
    for (const auto& [id, b] : banked_) cands.push_back({id, relevance(id, b.keys), b.len, true});
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.rel > b.rel; });
    int64_t room = cfg_.budget - fixed - probe.fresh - cfg_.reserve;
    int64_t restored = 0;
    std::vector<std::string> leave, back;
    int64_t held = 0;  // blocks chosen for the message so far
    // With a relevance margin, only blocks within it of the most relevant one (the block before
    // the message aside) are candidates.
    double min_rel = -std::numeric_limits<double>::infinity();
    if (cfg_.relevance_margin >= 0)
      for (const auto& c : cands)
        if (std::isfinite(c.rel)) min_rel = std::max(min_rel, c.rel - cfg_.relevance_margin);
    for (const auto& c : cands) {
      const bool fits = c.len <= room && (!c.banked || cfg_.recall_blocks == 0 || restored < cfg_.recall_blocks) &&
                        (cfg_.message_blocks == 0 || held < cfg_.message_blocks) && c.rel >= min_rel;
      if (fits) {
        ++held;
        room -= c.len;
        if (c.banked) back.push_back(c.id), ++restored;
        used_[c.id] = ++clock_;  // relevant now: evicted last
      } else if (!c.banked) {
        leave.push_back(c.id);
      }
    }
    for (const auto& id : leave) evict(w, id, plan);
    if (compact_) {
      compact(w, std::set<std::string>(leave.begin(), leave.end()), back, plan);
    } else {
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
      }
    }
    for (const auto& id : back) banked_.erase(id), ++recoveries_;
    return plan;
  }

  int64_t next_position(const KvWindow& w, int64_t next) const override {
    int64_t top = compact_ ? 0 : next;  // compact: right after the window's last position
    for (int l = 0; l < w.spec().n_layers; ++l)
      if (w.size(l) > 0) top = std::max(top, w.pos(l).select(1, 0).max().item<int64_t>() + 1);
    return top;
  }

  std::vector<std::pair<std::string, std::string>> take_breadcrumbs() override { return std::exchange(crumbs_, {}); }

  int64_t evictions() const override { return evictions_; }
  int64_t recoveries() const override { return recoveries_; }

  // The state as JSON: use and arrival stamps, the relevance vectors (float64, exact through
  // JSON), token ids, breadcrumbs, counters and which blocks are banked; a banked block's keys and
  // positions are read back from the bank on loading (they are its K at the relevance layer).
  nlohmann::json save_state() const override {
    auto vectors = [](const std::map<std::string, at::Tensor>& m) {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [id, t] : m) {
        if (!t.defined()) continue;
        const at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
        o[id] = std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
      }
      return o;
    };
    std::vector<std::string> banked;
    for (const auto& [id, b] : banked_) banked.push_back(id);
    return {{"used", used_},         {"born", born_},           {"hidden", vectors(hidden_)},
            {"vec", vectors(vec_)},  {"ids", ids_},             {"crumbs", crumbs_},
            {"clock", clock_},       {"arrivals", arrivals_},   {"evictions", evictions_},
            {"recoveries", recoveries_}, {"banked", banked}};
  }

  void load_state(const nlohmann::json& j, const KvMemory& memory) override {
    reset();
    try {
      used_ = j.at("used").get<std::map<std::string, int64_t>>();
      born_ = j.at("born").get<std::map<std::string, int64_t>>();
      ids_ = j.at("ids").get<std::map<std::string, std::vector<int64_t>>>();
      for (const auto& [id, v] : j.at("hidden").items()) hidden_[id] = at::tensor(v.get<std::vector<double>>(), at::kDouble);
      for (const auto& [id, v] : j.at("vec").items()) vec_[id] = at::tensor(v.get<std::vector<double>>(), at::kDouble);
      crumbs_ = j.at("crumbs").get<std::vector<std::pair<std::string, std::string>>>();
      clock_ = j.at("clock").get<int64_t>();
      arrivals_ = j.at("arrivals").get<int64_t>();
      evictions_ = j.at("evictions").get<int64_t>();
      recoveries_ = j.at("recoveries").get<int64_t>();
      const int L = memory.spec().n_layers;
      const int layer = cfg_.relevance_layer < 0 ? L + cfg_.relevance_layer : cfg_.relevance_layer;
      for (const auto& idj : j.at("banked")) {
        const std::string id = idj.get<std::string>();
        if (!memory.bank().contains(id))
          throw CorruptData(str_cat(name(), ": the snapshot banks '", id, "', which the bank does not hold"));
        const Block b = memory.bank().peek(id);
        if (static_cast<int>(b.layers.size()) != L)
          throw CorruptData(str_cat(name(), ": banked block '", id, "' has ", b.layers.size(), " layers, not ", L));
        Banked bk;
        bk.keys = b.layers[layer].k.to(at::kCPU, at::kFloat).clone();
        bk.len = b.layers[0].n_tokens();
        if (bk.len > 0) {
          const at::Tensor pos = b.layers[0].pos.to(at::kCPU).select(1, 0);
          bk.first = pos.min().item<int64_t>();
          bk.span = pos.max().item<int64_t>() - bk.first + 1;
        }
        banked_[id] = std::move(bk);
      }
    } catch (const nlohmann::json::exception& e) {
      reset();
      throw CorruptData(str_cat(name(), ": a malformed state in the session snapshot: ", e.what()));
    }
  }

  void reset() override {
    banked_.clear();
    used_.clear();
    born_.clear();
    hidden_.clear();
    crumbs_.clear();
    ids_.clear();
    vec_.clear();
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
  // with_last (before a new message, when nothing is being written), none that is pinned, a
  // sink or within its kind's floor.
  std::vector<std::string> evictable(const KvWindow& w, bool with_last = false) const {
    const std::string last = with_last ? "" : last_block(w);
    std::vector<std::string> held;
    for (const auto& s : w.layout().segments(w.layout().region("blocks")))
      if (w.layout().segment_len(0, s.id) > 0) held.push_back(s.id);
    std::set<std::string> kept;
    if (cfg_.sink_blocks > 0) {  // the first blocks to arrive, whether they are here or not
      const int blocks = w.layout().region("blocks");
      std::vector<std::pair<int64_t, std::string>> by_birth;
      for (const auto& [id, b] : born_) {
        const int r = w.layout().find(id).first;
        if (r < 0 || r == blocks) by_birth.push_back({b, id});
      }
      std::sort(by_birth.begin(), by_birth.end());
      for (size_t i = 0; i < by_birth.size() && static_cast<int64_t>(i) < cfg_.sink_blocks; ++i)
        kept.insert(by_birth[i].second);
    }
    std::map<std::string, std::vector<std::pair<int64_t, std::string>>> by_kind;  // most recent use first
    for (const auto& id : held) {
      if (w.meta(id).pinned) kept.insert(id);
      if (cfg_.kind_floors.count(w.meta(id).kind)) by_kind[w.meta(id).kind].push_back({-used_.at(id), id});
    }
    for (auto& [kind, blocks] : by_kind) {
      std::sort(blocks.begin(), blocks.end());
      for (size_t i = 0; i < blocks.size() && static_cast<int64_t>(i) < cfg_.kind_floors.at(kind); ++i)
        kept.insert(blocks[i].second);
    }
    std::vector<std::string> out;
    for (const auto& id : held)
      if (id != last && !kept.count(id)) out.push_back(id);
    return out;
  }

  // Keeps what relevance "hidden" or "embedding" needs of the step's segment: the sum of its
  // hidden states, or its token ids (its vector is made again when next needed).
  void describe(const StepView& step) {
    if (cfg_.relevance == "hidden" && step.hidden.defined()) {
      at::Tensor& sum = hidden_[step.segment];
      const at::Tensor add = step.hidden.to(at::kCPU, at::kDouble).sum(0);
      sum = sum.defined() ? sum + add : add;
      vec_[step.segment] = sum / sum.norm().clamp_min(1e-12);
    } else if (cfg_.relevance == "embedding" && step.tokens.defined()) {
      const at::Tensor t = step.tokens.to(at::kCPU, at::kLong).contiguous();
      auto& ids = ids_[step.segment];
      ids.insert(ids.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
      vec_.erase(step.segment);
    }
  }

  // Relevance "embedding": embeds the message and every block whose text changed since its
  // last embedding, in one call; returns the message's vector.
  at::Tensor embed_pending(const at::Tensor& message_tokens) {
    const at::Tensor t = message_tokens.to(at::kCPU, at::kLong).contiguous();
    std::vector<std::vector<int64_t>> texts{{t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()}};
    std::vector<std::string> which;
    for (const auto& [id, ids] : ids_)
      if (!vec_.count(id)) texts.push_back(ids), which.push_back(id);
    const at::Tensor e = cfg_.embedder(texts).to(at::kCPU, at::kDouble);
    WM_CHECK(e.dim() == 2 && e.size(0) == static_cast<int64_t>(texts.size()), name(), ": the embedder gave ",
             e.sizes(), " for ", texts.size(), " texts");
    for (size_t i = 0; i < which.size(); ++i) vec_[which[i]] = e[static_cast<int64_t>(i) + 1];
    return e[0];
  }

  // Stamps blocks seen for the first time (use order, arrival order).
  void touch_new(const KvWindow& w) {
    for (const auto& s : w.layout().segments(w.layout().region("blocks")))
      if (!used_.count(s.id)) used_[s.id] = ++clock_;
    for (const auto& r : w.layout().region_names())
      for (const auto& s : w.layout().segments(w.layout().region(r)))
        if (!born_.count(s.id) && w.layout().segment_len(0, s.id) > 0) born_[s.id] = ++arrivals_;
  }

  // Placement "compact": the plan's last ops re-anchor what the window will hold (its segments
  // but `leaving`, and the banked blocks `back` it fetches) to positions 0, 1, ... in arrival
  // order. Each block's positions are one contiguous run (it was fed that way and moves whole).
  void compact(const KvWindow& w, const std::set<std::string>& leaving, const std::vector<std::string>& back,
               MemoryPlan& plan) {
    struct Run {
      int64_t born, first, span;
      std::string id;
      bool fetched;
    };
    std::vector<Run> runs;
    const at::Tensor pos = w.size(0) > 0 ? w.pos(0).select(1, 0) : at::Tensor();
    for (const auto& r : w.layout().region_names())
      for (const auto& s : w.layout().segments(w.layout().region(r))) {
        const int64_t n = w.layout().segment_len(0, s.id);
        if (n == 0 || leaving.count(s.id)) continue;
        const at::Tensor p = pos.narrow(0, w.layout().segment_begin(0, s.id), n);
        const int64_t first = p.min().item<int64_t>();
        runs.push_back({born_.at(s.id), first, p.max().item<int64_t>() - first + 1, s.id, false});
      }
    for (const auto& id : back) {
      const Banked& b = banked_.at(id);
      runs.push_back({born_.at(id), b.first, b.span, id, true});
    }
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.born < b.born; });
    int64_t next = 0;
    for (const auto& r : runs) {
      const int64_t delta = next - r.first;
      if (r.fetched) plan.fetch(r.id, "blocks", Reanchor{0, delta});
      else if (delta != 0) plan.move(r.id, Reanchor{0, delta});
      next += r.span;
    }
  }

  void evict(const KvWindow& w, const std::string& id, MemoryPlan& plan) {
    ++evictions_;
    if (discard_) {
      plan.drop(id);
      // A breadcrumb stands where the block stood (in arrival order); a breadcrumb leaves none.
      if (recovery_ == "breadcrumb" && id.rfind(kCrumb, 0) != 0) {
        const std::string crumb = kCrumb + id;
        crumbs_.push_back({crumb, "[" + id + " moved out of context]\n"});
        if (born_.count(id)) born_[crumb] = born_.at(id);
      }
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

  static constexpr const char* kCrumb = "crumb:";  // a breadcrumb's segment: "crumb:" + the block's id

  std::string recovery_;  // restore, discard or breadcrumb
  bool discard_;          // evicted blocks are gone (discard, breadcrumb)
  std::vector<std::pair<std::string, std::string>> crumbs_;  // breadcrumbs not yet handed over
  bool compact_ = cfg_.placement == "compact";
  std::map<std::string, Banked> banked_;
  std::map<std::string, int64_t> used_;  // per block: when it was last placed or found relevant
  std::map<std::string, int64_t> born_;  // per segment: its arrival order (placement "compact")
  // Relevance "hidden": per segment the sum of its hidden states; "embedding": its token ids.
  // vec_: per segment its unit vector for the message's to meet (float64, CPU).
  std::map<std::string, at::Tensor> hidden_;
  std::map<std::string, std::vector<int64_t>> ids_;
  std::map<std::string, at::Tensor> vec_;
  int64_t clock_ = 0, arrivals_ = 0;
  int64_t evictions_ = 0, recoveries_ = 0;
};

}  // namespace

std::unique_ptr<TextPolicy> make_evoke(const TextMemoryConfig& cfg) {
  return std::make_unique<Evoke>(cfg, cfg.recovery);
}
std::unique_ptr<TextPolicy> make_evoke_discard(const TextMemoryConfig& cfg) {
  return std::make_unique<Evoke>(cfg, "discard");
}
std::unique_ptr<TextPolicy> make_evoke_breadcrumb(const TextMemoryConfig& cfg) {
  return std::make_unique<Evoke>(cfg, "breadcrumb");
}

}  // namespace wm::llm
