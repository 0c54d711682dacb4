// keepkv: KeepKV. Every window entry carries a vote count p (the core's log-weight, log p; a
// fresh token has one vote). A layer over budget merges its lowest-scoring entries, the last
// `recent` excluded, each into the kept entry whose key is most similar (cosine over the kv
// heads), by ZIP-merging (llmkv/merge.h): votes add up, and for the step's last query the
// attention output is what it was before the merge. Scores are an exponential moving average of
// the attention each entry received (the mean over the step's last `score_window` queries, as
// SnapKV's observation window at the end of a prompt, or over all of them; summed over heads),
// bias-corrected for the steps an entry has seen; a merged entry scores the sum of its members.
// A prompt step (more than one token) restarts the average from its own attention
// (`prompt_restart`): its last queries, a question among them, say best what matters next.
// Added to KeepKV: the scores are max-pooled over `score_kernel` (7) neighbouring entries before
// the choice, as SnapKV pools its votes (score_kernel 1: KeepKV as published).
// keepkv_ev, the ablation: the same votes and choices, keys and values vote-weighted means.
//
// Per kv head (keepkv, keepkv_ev; as published): each head scores its own entries from its own
// attention, merges its own lowest-scoring ones into its own most similar kept key (cosine over
// that head's key) with its own votes, and stops seeing what it merged away
// (KvWindow::write_head_tokens, keep_tokens_per_head): the window holds the union of the heads'
// entries. keepkv_layer and keepkv_ev_layer choose per layer, the heads' scores summed, the
// similarity over all heads' keys (one token set per layer, as before per-head selection).
//
// Periodic refresh (refresh_every = T > 0): an original entry (one vote, never merged) that a
// merge is about to change goes to the bank first, so that the window's originals and the bank
// together hold the full KV. Every T steps each layer is rebuilt from it: the originals the
// step's last query attends to most (the recent ones always) are kept, every other original
// merges into the kept one with the most similar key, and the window takes the result in place
// of its merged entries, which had drifted over many merges at older queries.
#include <ATen/ops/max_pool1d.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "llmkv/merge.h"
#include "llmkv/text_policy.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

class KeepKv final : public TextPolicy {
 public:
  KeepKv(const TextMemoryConfig& cfg, MergeRule rule, bool per_head) : TextPolicy(cfg), rule_(rule), per_head_(per_head) {
    recent_ = cfg.recent > 0 ? cfg.recent : cfg.budget / 4;
    WM_CHECK(recent_ < cfg.budget - cfg.slack, name(), " needs a KV budget (less slack) above its ", recent_,
             " recent tokens, got ", cfg.budget - cfg.slack);
    WM_CHECK(!per_head || cfg.refresh_every == 0, name(), " merges per kv head and has no periodic refresh yet; "
             "refresh_every needs ", name(), "_layer");
  }

  StepNeeds step_needs() const override {
    StepNeeds n;
    n.key_mass = true;
    n.mass_queries = cfg_.score_window;
    n.query = true;
    return n;
  }

  MemoryPlan observe(const KvMemory& memory, const StepView& step) override {
    if (per_head_) return observe_per_head(memory, step);
    const KvWindow& w = memory.window();
    const int L = w.spec().n_layers;
    WM_CHECK(static_cast<int>(step.key_mass.size()) == L && static_cast<int>(step.query.size()) == L, name(),
             " needs the key mass and the last query of all ", L, " layers");
    const double scale = 1.0 / std::sqrt(static_cast<double>(w.spec().head_dim));
    ema_.resize(L);
    seen_.resize(L);
    stash_.resize(L);
    ++steps_;
    MemoryPlan plan;
    const bool refresh = cfg_.refresh_every > 0 && steps_ % cfg_.refresh_every == 0;
    for (int l = 0; l < L; ++l) {
      const int64_t n = w.size(l);
      const at::Tensor& mass = step.key_mass[l];
      WM_CHECK(mass.dim() == 2 && mass.size(1) == n, "layer ", l, ": key mass ", mass.sizes(), " for ", n, " keys");
      auto [ema, seen] = moving_scores(l, mass.sum(0, true), step.fresh);
      ema = ema.squeeze(0);
      if (refresh && !stash_[l].empty()) {
        rebuild_layer(memory, l, step.query[l], scale, ema, seen, plan);
      } else if (n > cfg_.budget) {
        merge_layer(w, l, step.query[l], scale, ema, seen, plan);
      }
      ema_[l] = ema.unsqueeze(0);
      seen_[l] = seen;
    }
    return plan;
  }

  // Layer l's scores after a step of `fresh` tokens from its key mass rows [R, n] (R = 1: the
  // heads summed; R = n_kv_heads: per head): each key's mean attention over the scoring queries
  // that see it (the step's last score_window, or all of them: a key inside that window is seen
  // by the queries from it on), folded into the moving average ema [R, n] (restarted by a
  // prompt step when prompt_restart: its own window decides, as SnapKV's observation window),
  // and the steps each key has been scored, seen [n].
  std::pair<at::Tensor, at::Tensor> moving_scores(int l, const at::Tensor& mass_rows, int64_t fresh) {
    const double beta = cfg_.score_decay;
    const int64_t R = mass_rows.size(0), n = mass_rows.size(1), before = n - fresh;
    if (!ema_[l].defined() || ema_[l].dim() != 2 || ema_[l].size(0) != R || ema_[l].size(1) != before) {
      ema_[l] = at::zeros({R, before}, at::kDouble);
      seen_[l] = at::zeros({before}, at::kDouble);
    }
    const int64_t wq = cfg_.score_window > 0 ? std::min(cfg_.score_window, fresh) : fresh;
    const at::Tensor seen_by = at::clamp_max(at::arange(n, 0, -1, at::kDouble), static_cast<double>(wq));
    const at::Tensor m = mass_rows.to(at::kCPU, at::kDouble) / seen_by.unsqueeze(0);
    if (cfg_.prompt_restart && fresh > 1) return {m * (1.0 - beta), at::ones({n}, at::kDouble)};
    return {at::cat({ema_[l], at::zeros({R, fresh}, at::kDouble)}, 1) * beta + m * (1.0 - beta),
            at::cat({seen_[l], at::zeros({fresh}, at::kDouble)}) + 1.0};
  }

  // Per kv head: the same scores, each head's from its own attention ([KH, n] state), and the
  // same merge, each head on its own entries.
  MemoryPlan observe_per_head(const KvMemory& memory, const StepView& step) {
    const KvWindow& w = memory.window();
    const int L = w.spec().n_layers;
    const int64_t KH = w.spec().n_kv_heads;
    WM_CHECK(static_cast<int>(step.key_mass.size()) == L && static_cast<int>(step.query.size()) == L, name(),
             " needs the key mass and the last query of all ", L, " layers");
    const double scale = 1.0 / std::sqrt(static_cast<double>(w.spec().head_dim));
    ema_.resize(L);
    seen_.resize(L);
    MemoryPlan plan;
    for (int l = 0; l < L; ++l) {
      const int64_t n = w.size(l);
      const at::Tensor& mass = step.key_mass[l];
      WM_CHECK(mass.dim() == 2 && mass.size(0) == KH && mass.size(1) == n, "layer ", l, ": key mass ", mass.sizes(),
               " for ", KH, " x ", n, " keys");
      auto [ema, seen] = moving_scores(l, mass, step.fresh);
      const at::Tensor hl = w.head_logw(l);
      const at::Tensor vis = hl.defined() ? hl.to(at::kCPU).gt(kHiddenLogw / 2) : at::ones({KH, n}, at::kBool);
      if (vis.sum(1).max().item<int64_t>() > cfg_.budget) merge_layer_per_head(w, l, step.query[l], scale, vis, ema, seen, plan);
      ema_[l] = ema;
      seen_[l] = seen;
    }
    return plan;
  }

  // Plans layer l's per-head merges: each head over budget down to budget - slack; ema [KH, n]
  // and seen [n] come back over the union of what the heads keep.
  void merge_layer_per_head(const KvWindow& w, int l, const at::Tensor& q, double scale, const at::Tensor& vis,
                            at::Tensor& ema, at::Tensor& seen, MemoryPlan& plan) {
    const int64_t n = w.size(l), KH = w.spec().n_kv_heads, cand = n - recent_;
    const at::Device dev = w.k(l).device();
    const at::Tensor score = ema / (1.0 - at::pow(cfg_.score_decay, seen)).unsqueeze(0);
    const at::Tensor ema_c = ema.contiguous();
    const at::Tensor keys = w.k(l).to(at::kCPU, at::kFloat);  // [KH, n, d]
    at::Tensor lw = w.logw(l).to(at::kCPU, at::kFloat).unsqueeze(0).expand({KH, n});
    const at::Tensor hl = w.head_logw(l);
    if (hl.defined()) lw = lw + hl.to(at::kCPU);
    std::vector<std::vector<int64_t>> lists(KH);
    std::vector<std::vector<double>> list_score(KH);
    const at::Tensor visc = vis.contiguous();
    for (int64_t h = 0; h < KH; ++h) {
      const bool* vp = visc.data_ptr<bool>() + h * n;
      std::vector<int64_t> cands;  // the candidates head h sees, in order
      for (int64_t i = 0; i < cand; ++i)
        if (vp[i]) cands.push_back(i);
      int64_t seen_count = static_cast<int64_t>(cands.size());
      for (int64_t i = std::max<int64_t>(cand, 0); i < n; ++i) seen_count += vp[i] ? 1 : 0;
      const double* raw = ema_c.data_ptr<double>() + h * n;  // the moving averages, uncorrected
      if (seen_count <= cfg_.budget || cands.empty()) {  // this head keeps what it sees
        for (int64_t i = 0; i < n; ++i)
          if (vp[i]) lists[h].push_back(i), list_score[h].push_back(raw[i]);
        continue;
      }
      const int64_t nc = static_cast<int64_t>(cands.size());
      const int64_t excess = std::min(nc, seen_count - evict_to());
      const at::Tensor ci = at::tensor(cands, at::kLong);
      const at::Tensor cs = score.select(0, h).index_select(0, ci).contiguous();
      const std::vector<int64_t> keep_c = keep_top_and_recent(pooled(cs), nc - excess, nc, 0);
      std::vector<int64_t> group(nc, -1), targets, sources;
      for (size_t g = 0; g < keep_c.size(); ++g) group[keep_c[g]] = static_cast<int64_t>(g);
      for (int64_t c = 0; c < nc; ++c) (group[c] >= 0 ? targets : sources).push_back(c);
      const int64_t G = static_cast<int64_t>(keep_c.size());
      std::vector<double> gscore(G, 0.0);
      if (!sources.empty() && !targets.empty()) {
        const at::Tensor kh = keys.select(0, h).index_select(0, ci);  // [nc, d]
        const at::Tensor unit = kh / kh.norm(2, 1, true).clamp_min(1e-12);
        const at::Tensor best = unit.index_select(0, at::tensor(sources, at::kLong))
                                    .matmul(unit.index_select(0, at::tensor(targets, at::kLong)).t())
                                    .argmax(1)
                                    .contiguous();
        const int64_t* b = best.data_ptr<int64_t>();
        for (size_t s = 0; s < sources.size(); ++s) group[sources[s]] = group[targets[b[s]]];
        // Merge only the groups that change: their members, in order.
        std::vector<int64_t> local(G, -1), written, sub, sub_group;
        for (int64_t src : sources)
          if (local[group[src]] < 0) {
            local[group[src]] = static_cast<int64_t>(written.size());
            written.push_back(cands[keep_c[group[src]]]);
          }
        for (int64_t c = 0; c < nc; ++c)
          if (local[group[c]] >= 0) sub.push_back(cands[c]), sub_group.push_back(local[group[c]]);
        const at::Tensor si = at::tensor(sub, at::kLong);
        const at::Tensor si_dev = si.to(dev);
        const MergedKv merged = merge_groups(w.k(l).narrow(0, h, 1).index_select(1, si_dev),
                                             w.v(l).narrow(0, h, 1).index_select(1, si_dev),
                                             lw.select(0, h).index_select(0, si).to(dev), sub_group,
                                             static_cast<int64_t>(written.size()), q.narrow(0, h, 1).to(dev), scale,
                                             rule_);
        plan.write_head(l, static_cast<int>(h), written, merged.k, merged.v, merged.logw);
      }
      // A merged entry scores what its members scored, and has been seen as long as its target.
      for (int64_t c = 0; c < nc; ++c) gscore[group[c]] += raw[cands[c]];
      for (int64_t g = 0; g < G; ++g) lists[h].push_back(cands[keep_c[g]]), list_score[h].push_back(gscore[g]);
      for (int64_t i = std::max<int64_t>(cand, 0); i < n; ++i)
        if (vp[i]) lists[h].push_back(i), list_score[h].push_back(raw[i]);
    }
    // The state over the union, as the window will hold it.
    std::vector<char> in(n, 0);
    for (const auto& li : lists)
      for (int64_t i : li) in[i] = 1;
    std::vector<int64_t> uni, at_union(n, -1);
    for (int64_t i = 0; i < n; ++i)
      if (in[i]) at_union[i] = static_cast<int64_t>(uni.size()), uni.push_back(i);
    at::Tensor ema_u = at::zeros({KH, static_cast<int64_t>(uni.size())}, at::kDouble);
    double* ep = ema_u.data_ptr<double>();
    for (int64_t h = 0; h < KH; ++h)
      for (size_t j = 0; j < lists[h].size(); ++j)
        ep[h * static_cast<int64_t>(uni.size()) + at_union[lists[h][j]]] = list_score[h][j];
    seen = seen.index_select(0, at::tensor(uni, at::kLong));
    ema = ema_u;
    plan.keep_per_head(l, std::move(lists));
  }

  void reset() override {
    ema_.clear(), seen_.clear(), stash_.clear();
    steps_ = 0;
  }

 private:
  // The order in which candidates are kept, as scores for keep_top_and_recent: by their scores
  // max-pooled over score_kernel neighbours (as SnapKV pools its votes, so that a key the query
  // wants keeps the tokens around it), ties within a pooled plateau broken by the score itself
  // (the peak first). score_kernel 1: the scores as they are.
  at::Tensor pooled(const at::Tensor& score) const {
    const int64_t k = cfg_.score_kernel, n = score.size(0);
    if (k <= 1 || n == 0) return score;
    const at::Tensor p = at::max_pool1d(score.view({1, 1, -1}), {k}, {1}, {k / 2}).view({-1}).contiguous();
    const at::Tensor raw = score.contiguous();
    const double* pp = p.data_ptr<double>();
    const double* rp = raw.data_ptr<double>();
    std::vector<int64_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return pp[a] != pp[b] ? pp[a] > pp[b] : rp[a] > rp[b];
    });
    at::Tensor rank = at::empty({n}, at::kDouble);
    double* rk = rank.data_ptr<double>();
    for (int64_t r = 0; r < n; ++r) rk[order[r]] = static_cast<double>(n - r);
    return rank;
  }

  // Plans layer l's merge down to the budget and leaves ema/seen as the kept entries' state.
  void merge_layer(const KvWindow& w, int l, const at::Tensor& q, double scale, at::Tensor& ema, at::Tensor& seen,
                   MemoryPlan& plan) {
    const int64_t n = w.size(l), excess = n - evict_to(), cand = n - recent_;
    // Bias-corrected scores of the candidates; the lowest `excess` go.
    const at::Tensor score = ema / (1.0 - at::pow(cfg_.score_decay, seen));
    std::vector<int64_t> keep = keep_top_and_recent(pooled(score.narrow(0, 0, cand)), cand - excess, n, recent_);
    std::vector<bool> kept(n, false);
    for (int64_t i : keep) kept[i] = true;
    std::vector<int64_t> sources, targets;  // targets: the kept candidates
    for (int64_t i = 0; i < cand; ++i) (kept[i] ? targets : sources).push_back(i);
    // Each source joins the kept candidate with the most similar key (cosine over all kv heads).
    const at::Tensor keys = w.k(l).to(at::kCPU, at::kFloat).permute({1, 0, 2}).reshape({n, -1});
    const at::Tensor unit = keys / keys.norm(2, 1, true).clamp_min(1e-12);
    const at::Tensor ti = at::tensor(targets, at::kLong), si = at::tensor(sources, at::kLong);
    const at::Tensor best = unit.index_select(0, si).matmul(unit.index_select(0, ti).t()).argmax(1);
    std::vector<int64_t> group(n, -1);
    for (size_t g = 0; g < keep.size(); ++g) group[keep[g]] = static_cast<int64_t>(g);
    const auto* b = best.data_ptr<int64_t>();
    for (size_t s = 0; s < sources.size(); ++s) group[sources[s]] = group[targets[b[s]]];
    const int64_t G = static_cast<int64_t>(keep.size());
    // Merge only what changes: the sources and the kept entries they join (groups of one come
    // out as they went in, so the rest of the layer need not be touched).
    std::vector<int64_t> local(G, -1), written, sub;
    for (int64_t src : sources)
      if (local[group[src]] < 0) {
        local[group[src]] = static_cast<int64_t>(written.size());
        written.push_back(keep[group[src]]);
      }
    std::vector<int64_t> sub_group;
    for (int64_t i = 0; i < n; ++i)
      if (group[i] >= 0 && local[group[i]] >= 0) sub.push_back(i), sub_group.push_back(local[group[i]]);
    if (cfg_.refresh_every > 0) stash_originals(w, l, sub, plan);
    const at::Tensor si_dev = at::tensor(sub, at::kLong).to(w.k(l).device());
    const MergedKv merged =
        merge_groups(w.k(l).index_select(1, si_dev), w.v(l).index_select(1, si_dev),
                     w.logw(l).index_select(0, si_dev), sub_group, static_cast<int64_t>(written.size()),
                     q.to(w.k(l).device()), scale, rule_);
    plan.write(l, written, merged.k, merged.v, merged.logw);
    // A merged entry scores what its members scored, and has been seen as long as its target.
    const at::Tensor gi_all = at::tensor(group, at::kLong);
    at::Tensor ema_g = at::zeros({G}, at::kDouble).index_add_(0, gi_all, ema);
    const at::Tensor ki = at::tensor(keep, at::kLong);
    seen = seen.index_select(0, ki);
    ema = ema_g;
    plan.keep(l, std::move(keep));
  }

  // Refresh: banks the original entries (log-weight 0) among layer l's tokens `idx` (the ones a
  // merge is about to change) as a block of their own, layer l only.
  void stash_originals(const KvWindow& w, int l, const std::vector<int64_t>& idx, MemoryPlan& plan) {
    const at::Tensor i = at::tensor(idx, at::kLong);
    const at::Tensor orig = w.logw(l).to(at::kCPU).index_select(0, i).eq(0.0);
    const at::Tensor pick = i.masked_select(orig);
    if (pick.numel() == 0) return;
    const at::Tensor pick_dev = pick.to(w.k(l).device());
    Block b;
    b.id = str_cat("keepkv:", l, ":", stash_[l].size());
    const KvSpec& spec = w.spec();
    for (int j = 0; j < spec.n_layers; ++j) {
      LayerKv kv;
      if (j == l) {
        kv.k = w.k(l).index_select(1, pick_dev).clone();
        kv.v = w.v(l).index_select(1, pick_dev).clone();
        kv.pos = w.pos(l).index_select(0, pick).clone();
        kv.logw = at::zeros({pick.numel()}, at::TensorOptions().dtype(at::kFloat).device(w.k(l).device()));
      } else {
        kv.k = at::empty({spec.n_kv_heads, 0, spec.head_dim}, w.k(l).options());
        kv.v = at::empty({spec.n_kv_heads, 0, spec.head_dim}, w.v(l).options());
        kv.pos = at::empty({0, spec.rope.n_axes()}, at::kLong);
        kv.logw = at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(w.k(l).device()));
      }
      b.layers.push_back(std::move(kv));
    }
    stash_[l].push_back(b.id);
    plan.store(std::move(b));
  }

  // Refresh of layer l: its full KV (the window's originals and the banked ones, one per
  // position) merged down to the window's size (budget - slack when over the budget) around the
  // originals the query q attends to most; ema/seen restart from that attention.
  void rebuild_layer(const KvMemory& memory, int l, const at::Tensor& q, double scale, at::Tensor& ema,
                     at::Tensor& seen, MemoryPlan& plan) {
    const KvWindow& w = memory.window();
    const int64_t n = w.size(l);
    const at::Device dev = w.k(l).device();
    // The full KV: banked originals, then the window's (a position banked and back in the
    // window as an original counts once, from the window).
    std::vector<at::Tensor> ks, vs, ps;
    for (const auto& id : stash_[l]) {
      const Block b = memory.bank().peek(id);
      ks.push_back(b.layers[l].k.to(dev)), vs.push_back(b.layers[l].v.to(dev)), ps.push_back(b.layers[l].pos);
    }
    const at::Tensor orig = w.logw(l).to(at::kCPU).eq(0.0);
    const at::Tensor wi = at::arange(n, at::kLong).masked_select(orig);
    ks.push_back(w.k(l).index_select(1, wi.to(dev))), vs.push_back(w.v(l).index_select(1, wi.to(dev)));
    ps.push_back(w.pos(l).index_select(0, wi));
    at::Tensor K = at::cat(ks, 1), V = at::cat(vs, 1), P = at::cat(ps, 0);
    // One entry per position, the last copy (the window's) winning; in position order.
    const at::Tensor p0 = P.select(1, 0).contiguous();
    std::map<int64_t, int64_t> by_pos;
    for (int64_t i = 0; i < p0.size(0); ++i) by_pos[p0[i].item<int64_t>()] = i;
    std::vector<int64_t> order;
    for (const auto& [pos, i] : by_pos) order.push_back(i);
    const at::Tensor oi = at::tensor(order, at::kLong);
    K = K.index_select(1, oi.to(dev)), V = V.index_select(1, oi.to(dev)), P = P.index_select(0, oi);
    const int64_t m = K.size(1), G = std::min(m, n > cfg_.budget ? evict_to() : n), recent = std::min(recent_, G);
    // The query's attention over the full KV (summed over kv heads), the recent ones kept.
    const at::Tensor score =
        (K.to(at::kFloat).matmul(q.to(dev, at::kFloat).unsqueeze(-1)).squeeze(-1) * scale).softmax(1).sum(0).to(at::kCPU,
                                                                                                           at::kDouble);
    std::vector<int64_t> keep = keep_top_and_recent(pooled(score.narrow(0, 0, m - recent)), G - recent, m, recent);
    std::vector<int64_t> group(m, -1);
    for (size_t g = 0; g < keep.size(); ++g) group[keep[g]] = static_cast<int64_t>(g);
    std::vector<int64_t> sources, targets;
    for (int64_t i = 0; i < m - recent; ++i) (group[i] >= 0 ? targets : sources).push_back(i);
    if (!sources.empty() && !targets.empty()) {
      const at::Tensor flat = K.to(at::kCPU, at::kFloat).permute({1, 0, 2}).reshape({m, -1});
      const at::Tensor unit = flat / flat.norm(2, 1, true).clamp_min(1e-12);
      const at::Tensor best = unit.index_select(0, at::tensor(sources, at::kLong))
                                  .matmul(unit.index_select(0, at::tensor(targets, at::kLong)).t())
                                  .argmax(1);
      for (size_t s = 0; s < sources.size(); ++s) group[sources[s]] = group[targets[best[s].item<int64_t>()]];
    } else {
      for (int64_t src : sources) group[src] = group[keep.front()];
    }
    const MergedKv merged = merge_groups(K, V, at::zeros({m}, at::TensorOptions().dtype(at::kFloat).device(dev)),
                                         group, G, q.to(dev), scale, rule_);
    // Originals of the window that now merge go to the bank first.
    std::vector<int64_t> merged_now;
    std::vector<int64_t> count(G, 0);
    for (int64_t i = 0; i < m; ++i) ++count[group[i]];
    const at::Tensor wpos = w.pos(l).select(1, 0).contiguous();
    std::map<int64_t, int64_t> window_at;  // position -> window index, originals only
    for (int64_t j = 0; j < wi.size(0); ++j) window_at[wpos[wi[j].item<int64_t>()].item<int64_t>()] = wi[j].item<int64_t>();
    const at::Tensor pcol = P.select(1, 0).contiguous();
    for (int64_t i = 0; i < m; ++i) {
      const auto it = window_at.find(pcol[i].item<int64_t>());
      if (it != window_at.end() && count[group[i]] > 1) merged_now.push_back(it->second);
    }
    std::sort(merged_now.begin(), merged_now.end());
    stash_originals(w, l, merged_now, plan);
    std::vector<int64_t> all(G);
    for (int64_t g = 0; g < G; ++g) all[g] = g;
    if (G < n) plan.keep(l, std::vector<int64_t>(all));
    plan.write(l, all, merged.k, merged.v, merged.logw, P.index_select(0, at::tensor(keep, at::kLong)));
    // The scores restart from this step's attention: each entry its members' sum, seen once.
    const double beta = cfg_.score_decay;
    ema = at::zeros({G}, at::kDouble).index_add_(0, at::tensor(group, at::kLong), score) * (1.0 - beta);
    seen = at::ones({G}, at::kDouble);
  }

  MergeRule rule_;
  bool per_head_;
  int64_t recent_;
  std::vector<at::Tensor> ema_, seen_;       // per layer, per window entry (CPU, float64)
  std::vector<std::vector<std::string>> stash_;  // per layer, its banked originals' blocks (refresh)
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<TextPolicy> make_keepkv(const TextMemoryConfig& cfg) {
  return std::make_unique<KeepKv>(cfg, MergeRule::Zip, true);
}
std::unique_ptr<TextPolicy> make_keepkv_ev(const TextMemoryConfig& cfg) {
  return std::make_unique<KeepKv>(cfg, MergeRule::Votes, true);
}
std::unique_ptr<TextPolicy> make_keepkv_layer(const TextMemoryConfig& cfg) {
  return std::make_unique<KeepKv>(cfg, MergeRule::Zip, false);
}
std::unique_ptr<TextPolicy> make_keepkv_ev_layer(const TextMemoryConfig& cfg) {
  return std::make_unique<KeepKv>(cfg, MergeRule::Votes, false);
}

}  // namespace wm::llm
