#include "llmkv/recompute/blend.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/layer_loader.h"
#include "runtime/rope.h"

namespace wm::llm {

double ReuseStats::recomputed_fraction() const {
  if (memory_tokens == 0 || n_layers < 2) return 0.0;
  return static_cast<double>(recomputed_token_layers) / (static_cast<double>(memory_tokens) * (n_layers - 1));
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Damaged entries were met: the prompt starts over (they are now missing).
struct StartOver {};

at::Tensor index_tensor(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  if (!v.empty()) std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

// The union of two increasing, disjoint index lists, increasing.
std::vector<int64_t> merge_sorted(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out;
  out.reserve(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// [m, n] float32 on dev: 0 where key j <= q_pos[i], -inf after.
at::Tensor causal_bias(const at::Tensor& q_pos, int64_t n, at::Device dev) {
  const at::Tensor hidden = at::arange(n, at::kLong).unsqueeze(0) > q_pos.to(at::kLong).unsqueeze(1);
  return at::zeros({q_pos.size(0), n}, at::kFloat)
      .masked_fill_(hidden, -std::numeric_limits<float>::infinity())
      .to(dev);
}

// Attention of the queries of prompt tokens `pos` (increasing) over the prompt's keys K, V
// [n_kv_heads, N, d], each query seeing the keys up to its own position. The queries run in
// chunks of consecutive rows; a chunk reads only the keys up to its last query's position, and the
// bias covers only those (the causal half of the scores is never computed).
at::Tensor causal_rows_attention(const at::Tensor& q, const std::vector<int64_t>& pos, const at::Tensor& K,
                                 const at::Tensor& V) {
  constexpr int64_t kRows = 128;
  const int64_t m = static_cast<int64_t>(pos.size());
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < m; b += kRows) {
    const int64_t c = std::min(kRows, m - b);
    const int64_t seen = pos[b + c - 1] + 1;
    const std::vector<int64_t> chunk(pos.begin() + b, pos.begin() + b + c);
    AttentionOptions ao;
    if (pos[b] + 1 < seen) ao.bias = causal_bias(index_tensor(chunk), seen, K.device());
    outs.push_back(attention(q.narrow(1, b, c), K.narrow(1, 0, seen), V.narrow(1, 0, seen), at::Tensor(), ao).out);
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 1);
}

// The prompt as one token sequence and where its units and fresh tokens lie.
struct Layout {
  int64_t n = 0;
  std::vector<int64_t> ids;
  std::vector<int64_t> offsets;              // per segment, and the end
  std::vector<int64_t> fresh;                // tokens in no unit, increasing
  std::vector<char> reusable;                // per token: of a reusable segment
  int64_t memory_tokens = 0;                 // tokens of reusable segments
  std::vector<std::vector<int64_t>> unit_ids;  // per unit, its tokens' ids
};

Layout make_layout(const std::vector<PromptSegment>& prompt, const RecomputePlan& plan) {
  Layout lay;
  lay.offsets = segment_offsets(prompt);
  lay.n = lay.offsets.back();
  for (const auto& s : prompt) {
    lay.ids.insert(lay.ids.end(), s.ids.begin(), s.ids.end());
    lay.reusable.insert(lay.reusable.end(), s.ids.size(), s.reusable ? 1 : 0);
    if (s.reusable) lay.memory_tokens += static_cast<int64_t>(s.ids.size());
  }
  std::vector<char> in_unit(lay.n, 0);
  int64_t prev_end = 0;
  const int n_seg = static_cast<int>(prompt.size());
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const CacheUnit& c = plan.units[u];
    WM_CHECK(c.first >= 0 && c.first < c.last && c.last <= n_seg, "unit ", u, " covers segments [", c.first, ", ",
             c.last, ") of ", n_seg);
    WM_CHECK(c.begin == lay.offsets[c.first] && c.end == lay.offsets[c.last], "unit ", u, " spans tokens [", c.begin,
             ", ", c.end, ") but its segments span [", lay.offsets[c.first], ", ", lay.offsets[c.last], ")");
    WM_CHECK(c.begin >= prev_end && c.end > c.begin, "units must be in prompt order, disjoint and not empty (unit ", u,
             ")");
    for (int s = c.first; s < c.last; ++s)
      WM_CHECK(prompt[s].reusable, "unit ", u, " holds segment ", s, " ('", prompt[s].slot, "'), which is not reusable");
    prev_end = c.end;
    std::fill(in_unit.begin() + c.begin, in_unit.begin() + c.end, 1);
    lay.unit_ids.emplace_back(lay.ids.begin() + c.begin, lay.ids.begin() + c.end);
  }
  for (int64_t i = 0; i < lay.n; ++i)
    if (!in_unit[i]) lay.fresh.push_back(i);
  return lay;
}

// The executor's state at a check layer, as a policy sees it.
class View final : public BlendLayer {
 public:
  View(int layer, int n_layers, int64_t n, const std::vector<CacheUnit>& units, const std::vector<int64_t>& recomputed,
       const std::vector<int64_t>& fresh, const std::vector<int64_t>& row_of, const at::Tensor& q, const at::Tensor& k,
       at::Tensor fk, at::Tensor fv, at::Tensor ck, at::Tensor cv)
      : layer_(layer), n_layers_(n_layers), n_(n), units_(units), recomputed_(recomputed), fresh_(fresh),
        row_of_(row_of), q_(q), k_(k), fk_(std::move(fk)), fv_(std::move(fv)), ck_(std::move(ck)), cv_(std::move(cv)) {}

  int layer() const override { return layer_; }
  int n_layers() const override { return n_layers_; }
  int64_t n_prompt() const override { return n_; }
  const std::vector<CacheUnit>& units() const override { return units_; }
  const std::vector<int64_t>& recomputed() const override { return recomputed_; }
  const std::vector<int64_t>& fresh() const override { return fresh_; }
  at::Tensor fresh_k() const override { return fk_; }
  at::Tensor fresh_v() const override { return fv_; }
  at::Tensor cached_k() const override { return ck_; }
  at::Tensor cached_v() const override { return cv_; }

  at::Tensor attention_from(const std::vector<std::vector<int64_t>>& groups) const override {
    std::vector<int64_t> rows, pos, group_of;
    for (size_t g = 0; g < groups.size(); ++g)
      for (int64_t i : groups[g]) {
        WM_CHECK(i >= 0 && i < n_ && row_of_[i] >= 0, "prompt token ", i, " has no query at layer ", layer_,
                 " (neither recomputed nor fresh)");
        rows.push_back(row_of_[i]);
        pos.push_back(i);
        group_of.push_back(static_cast<int64_t>(g));
      }
    at::Tensor out = at::zeros({static_cast<int64_t>(groups.size()), n_}, at::kFloat);
    if (rows.empty()) return out;
    const at::Tensor q = q_.index_select(1, index_tensor(rows).to(q_.device()));
    const at::Tensor p = causal_attention_rows(q, index_tensor(pos), k_).to(at::kCPU);  // [m, n]
    out.index_add_(0, index_tensor(group_of), p);
    for (size_t g = 0; g < groups.size(); ++g)
      if (!groups[g].empty()) out[g].div_(static_cast<double>(groups[g].size()));
    return out;
  }

 private:
  int layer_, n_layers_;
  int64_t n_;
  const std::vector<CacheUnit>& units_;
  const std::vector<int64_t>& recomputed_;
  const std::vector<int64_t>& fresh_;
  const std::vector<int64_t>& row_of_;
  const at::Tensor& q_;
  const at::Tensor& k_;
  at::Tensor fk_, fv_, ck_, cv_;
};

// An entry's K/V for this prompt: in the cache, or prefilled during it (stored afterwards).
using Pending = std::unordered_map<ChunkKey, ChunkKv>;

void append_layer(KvWindow& window, const std::string& region, int l, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& pos) {
  window.append(region, "prompt", l, k, v, pos);
}

// full_recompute and prefix_cache: the leading units (exact) into the window, then one prefill.
at::Tensor run_prefill(ChunkCache& cache, const RecomputePlan& plan, const Layout& lay, Pending& pending,
                       KvWindow& window, const ReuseOptions& opt, ReuseStats& st) {
  LlmModelImpl& m = cache.model();
  const int L = cache.n_layers();
  // The exact prefix: units from token 0 on, back to back, while their entries are there.
  int64_t p_end = 0;
  std::vector<size_t> prefix;
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const CacheUnit& c = plan.units[u];
    WM_CHECK(c.exact, "a prefill plan's units must be exact (unit ", u, ")");
    if (c.begin != p_end || (!pending.count(c.key) && !cache.lookup(c.key))) break;
    prefix.push_back(u);
    p_end = c.end;
  }
  for (int l = 0; l < L; ++l)
    for (size_t u : prefix) {
      const CacheUnit& c = plan.units[u];
      LayerKv kv;
      if (pending.count(c.key)) {
        kv = pending.at(c.key).layers[l];
      } else {
        const Tier t = cache.tier_of(c.key, l);
        try {
          kv = cache.layer(c.key, l);  // reports a damaged file itself
        } catch (const CorruptData&) {
          st.corrupt += 1;
          throw StartOver{};
        }
        st.loaded_token_layers[static_cast<int>(t)] += c.n_tokens();
      }
      WM_CHECK(kv.pos[0][0].item<int64_t>() == c.begin, "prefix entry ", key_hex(c.key), " starts at position ",
               kv.pos[0][0].item<int64_t>(), ", its unit at ", c.begin);
      append_layer(window, opt.region, l, kv.k, kv.v, kv.pos);
    }
  st.reused_tokens = p_end;
  st.fresh_tokens = lay.n - p_end;
  st.computed_token_layers = (lay.n - p_end) * L;
  for (int64_t i = p_end; i < lay.n; ++i) st.recomputed_token_layers += lay.reusable[i] ? L - 1 : 0;
  const int64_t chunk = cache.config().prefill_chunk;
  const at::Tensor ids = index_tensor(lay.ids);
  StepOptions so;
  so.region = opt.region;
  so.segment = "prompt";
  at::Tensor logits;
  WM_CHECK(p_end < lay.n, "the prompt's last token must be computed (it gives the logits)");
  for (int64_t b = p_end; b < lay.n; b += chunk) {
    const int64_t c = std::min(chunk, lay.n - b);
    logits = m.step(ids.narrow(0, b, c), at::arange(b, b + c, at::kLong), window, so).logits;
  }
  return logits.select(0, logits.size(0) - 1).to(at::kCPU);
}

// The executor of a layer-wise plan: the prompt's layers one by one. Each unit's cached K/V is
// loaded per layer (re-anchored to the unit's offset), the carried tokens' K/V (recomputed)
// replace it, and at its check layers the policy narrows the carried set. One object per attempt.
class LayerwiseRun {
 public:
  // Resolves every unit's entry (a miss is prefilled alone now) and queues the first blocks.
  LayerwiseRun(ChunkCache& cache, RecomputePolicy& policy, const RecomputePlan& plan, const Layout& lay,
               Pending& pending, KvWindow& window, const ReuseOptions& opt, ReuseStats& st)
      : cache_(cache),
        policy_(policy),
        plan_(plan),
        lay_(lay),
        pending_(pending),
        window_(window),
        opt_(opt),
        st_(st),
        m_(cache.model()),
        L_(cache.n_layers()),
        N_(lay.n),
        dev_(m_.device()),
        spec_(window.spec()),
        units_(plan.units),
        U_(static_cast<int>(units_.size())) {
    WM_CHECK(!lay.fresh.empty() && lay.fresh.back() == N_ - 1, "a layer-wise plan needs the prompt's last token fresh");
    resolve_entries();
    choose_first_carried();
    loader_.emplace(cache.store(), L_, dev_, plan.balanced_loading ? -1 : 1, opt.load_bytes_per_s);
    queued_.assign(U_, std::vector<char>(L_, 0));
    queued_units_.resize(L_);
    queued_tiers_.resize(L_);
    queue_from(0);
    is_check_.assign(L_, 0);
    for (int c : plan.check_layers)
      if (c >= 0 && c < L_ - 1) is_check_[c] = 1;
  }

  // All layers, each appended to the window. Returns the logits [vocab] (float32, CPU) at the
  // prompt's last token. Throws StartOver when a loaded block is damaged.
  at::Tensor run() {
    const at::Tensor ids = index_tensor(lay_.ids);
    const at::Tensor pos_all = at::arange(N_, at::kLong);
    const at::Tensor pos_window = pos_all.unsqueeze(1);
    const auto [cos, sin] = m_.rope_cos_sin(pos_all);
    act_ = merge_sorted(carried_, lay_.fresh);
    act_dev_ = index_tensor(act_).to(dev_);
    x_ = m_.embed(ids.index_select(0, index_tensor(act_)));
    row_of_.assign(N_, -1);
    at::Tensor logits;
    for (int l = 0; l < L_; ++l) {
      LayerQueueLoader::Loaded ld = loader_->wait(l);
      check_loaded(l, ld);
      auto [K, V] = cached_kv(l, ld);

      // The carried tokens' K/V at this layer replace the cached ones.
      std::fill(row_of_.begin(), row_of_.end(), -1);
      for (size_t r = 0; r < act_.size(); ++r) row_of_[act_[r]] = static_cast<int64_t>(r);
      const Qkv p = m_.project(l, x_, cos.index_select(0, act_dev_), sin.index_select(0, act_dev_));
      at::Tensor ck, cv;
      if (is_check_[l] && plan_.cached_of_recomputed && l >= 1 && !carried_.empty()) {
        const at::Tensor c_dev = index_tensor(carried_).to(dev_);
        ck = K.index_select(1, c_dev);
        cv = V.index_select(1, c_dev);
      }
      K.index_copy_(1, act_dev_, p.k.to(spec_.dtype));
      V.index_copy_(1, act_dev_, p.v.to(spec_.dtype));
      if (l >= 1) st_.recomputed_token_layers += static_cast<int64_t>(carried_.size()) + fresh_memory_;

      if (is_check_[l]) select_carried(l, p, K, ck, cv);
      if (l < L_ - 1)
        advance(l, p, K, V);
      else
        logits = last_token_logits(l, p, K, V);
      append_layer(window_, opt_.region, l, K, V, pos_window);
    }
    const LayerQueueLoader::Stats ls = loader_->finish();
    st_.loader_idle_s = ls.idle_s;
    st_.loader_stall_s = ls.stall_s;
    st_.loader_busy_s = ls.busy_s;
    st_.loaded_bytes = ls.bytes;
    return logits;
  }

 private:
  // Every unit's entry: in the cache (loaded layer by layer), or prefilled alone now; and the
  // shift from its positions to the unit's.
  void resolve_entries() {
    cached_.assign(U_, 0);
    delta_.assign(U_, 0);
    for (int u = 0; u < U_; ++u) {
      const CacheUnit& c = units_[u];
      int64_t first = 0;
      if (pending_.count(c.key)) {
        first = pending_.at(c.key).first_position();
      } else if (cache_.lookup(c.key)) {
        cached_[u] = 1;
        first = cache_.first_position(c.key);
      } else {
        pending_[c.key] = cache_.prefill(lay_.unit_ids[u]);
        st_.prefilled_tokens += c.n_tokens();
        st_.misses += 1;
      }
      delta_[u] = c.begin - first;
      WM_CHECK(!c.exact || delta_[u] == 0, "unit ", u, " is marked exact but its entry starts at position ", first,
               ", the unit at ", c.begin);
    }
  }

  // The reused tokens carried through the layers (recomputed): every non-exact unit's at first.
  void choose_first_carried() {
    n_carried_.assign(U_, 0);
    unit_of_.assign(N_, -1);
    for (int u = 0; u < U_; ++u) {
      for (int64_t i = units_[u].begin; i < units_[u].end; ++i) unit_of_[i] = u;
      if (units_[u].exact) continue;
      for (int64_t i = units_[u].begin; i < units_[u].end; ++i) carried_.push_back(i);
      n_carried_[u] = units_[u].n_tokens();
    }
    st_.reused_tokens = 0;
    for (const auto& c : units_) st_.reused_tokens += c.n_tokens();
    st_.fresh_tokens = N_ - st_.reused_tokens;
    for (int64_t i : lay_.fresh) fresh_memory_ += lay_.reusable[i];
  }

  // Loading: a unit's layer-l block is needed when some of its tokens are not carried at l (once
  // dropped, never carried again), or when the plan compares cached and fresh K/V.
  bool needed(int u, int l) const {
    return units_[u].exact || n_carried_[u] < units_[u].n_tokens() || (plan_.cached_of_recomputed && l >= 1);
  }

  // Queues the cached blocks needed from layer `from` on that are not queued yet.
  void queue_from(int from) {
    for (int l = from; l < L_; ++l) {
      std::vector<std::string> ids;
      for (int u = 0; u < U_; ++u) {
        if (!cached_[u] || queued_[u][l] || !needed(u, l)) continue;
        queued_[u][l] = 1;
        ids.push_back(cache_.block_id(units_[u].key, l));
        queued_units_[l].push_back(u);
        queued_tiers_[l].push_back(cache_.tier_of(units_[u].key, l));
      }
      if (!ids.empty()) loader_->enqueue(l, ids);
    }
  }

  // Reports every damaged block of layer l; throws StartOver when there is one.
  void check_loaded(int l, const LayerQueueLoader::Loaded& ld) {
    bool damaged = false;
    for (size_t j = 0; j < ld.errors.size(); ++j) {
      if (!ld.errors[j]) continue;
      try {
        std::rethrow_exception(ld.errors[j]);
      } catch (const CorruptData& e) {
        cache_.report_corrupt(units_[queued_units_[l][j]].key, e.what());
        st_.corrupt += 1;
        damaged = true;
      }
    }
    if (damaged) throw StartOver{};
  }

  // The cache's K/V [n_kv_heads, N, head_dim] for layer l, re-anchored to the units' offsets,
  // zero where the carried tokens' K/V go. Throws wm::Error when a token is neither.
  std::pair<at::Tensor, at::Tensor> cached_kv(int l, const LayerQueueLoader::Loaded& ld) {
    std::vector<at::Tensor> ks, vs;
    std::vector<int64_t> dst, shift;
    bool moves = false;
    auto add = [&](int u, const LayerKv& kv) {
      WM_CHECK(kv.n_tokens() == units_[u].n_tokens(), "entry ", key_hex(units_[u].key), " holds ", kv.n_tokens(),
               " tokens at layer ", l, ", its unit ", units_[u].n_tokens());
      ks.push_back(kv.k);
      vs.push_back(kv.v);
      for (int64_t i = units_[u].begin; i < units_[u].end; ++i) dst.push_back(i), shift.push_back(delta_[u]);
      moves = moves || delta_[u] != 0;
    };
    for (size_t j = 0; j < ld.blocks.size(); ++j) {
      const int u = queued_units_[l][j];
      add(u, ld.blocks[j].layers.at(0));
      st_.loaded_token_layers[static_cast<int>(queued_tiers_[l][j])] += units_[u].n_tokens();
    }
    for (int u = 0; u < U_; ++u)
      if (!cached_[u] && needed(u, l)) add(u, pending_.at(units_[u].key).layers[l]);
    const auto kv_opts = at::TensorOptions().dtype(spec_.dtype).device(dev_);
    const int64_t KH = spec_.n_kv_heads, D = spec_.head_dim;
    at::Tensor K = at::zeros({KH, N_, D}, kv_opts), V = at::zeros({KH, N_, D}, kv_opts);
    std::vector<char> covered(N_, 0);
    if (!ks.empty()) {
      at::Tensor kc = at::cat(ks, 1).to(spec_.dtype), vc = at::cat(vs, 1).to(spec_.dtype);
      if (moves) kc = apply_rope(kc, index_tensor(shift).unsqueeze(1), spec_.rope);
      const at::Tensor dst_t = index_tensor(dst).to(dev_);
      K.index_copy_(1, dst_t, kc);
      V.index_copy_(1, dst_t, vc);
      for (int64_t i : dst) covered[i] = 1;
    }
    for (int64_t i : act_) covered[i] = 1;
    for (int64_t i = 0; i < N_; ++i)
      WM_CHECK(covered[i], "layer ", l, ": token ", i, " is neither computed nor loaded (unit ", unit_of_[i], ")");
    return {K, V};
  }

  // A check layer: the policy chooses the carried tokens from here on (a subset of the carried
  // ones); the blocks of what it drops are queued at once. ck, cv: the cached K/V of the carried
  // tokens when the plan compares them, else undefined.
  void select_carried(int l, const Qkv& p, const at::Tensor& K, const at::Tensor& ck, const at::Tensor& cv) {
    std::vector<int64_t> rows;
    rows.reserve(carried_.size());
    for (int64_t i : carried_) rows.push_back(row_of_[i]);
    const at::Tensor carried_rows_dev = index_tensor(rows).to(dev_);
    View view(l, L_, N_, units_, carried_, lay_.fresh, row_of_, p.q, K, p.k.index_select(1, carried_rows_dev),
              p.v.index_select(1, carried_rows_dev), ck, cv);
    std::vector<int64_t> keep = policy_.select(view);
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    std::vector<int64_t> next_n(U_, 0);
    for (int64_t i : keep) {
      WM_CHECK(i >= 0 && i < N_ && unit_of_[i] >= 0 && std::binary_search(carried_.begin(), carried_.end(), i),
               policy_.name(), " selected token ", i, " at layer ", l, ", which is not being recomputed");
      next_n[unit_of_[i]] += 1;
    }
    carried_ = std::move(keep);
    n_carried_ = std::move(next_n);
    queue_from(l + 1);
  }

  // Layer l's output for the tokens carried into the next layer (and the fresh ones).
  void advance(int l, const Qkv& p, const at::Tensor& K, const at::Tensor& V) {
    std::vector<int64_t> next = merge_sorted(carried_, lay_.fresh), rows;
    rows.reserve(next.size());
    for (int64_t i : next) rows.push_back(row_of_[i]);
    const at::Tensor rows_dev = index_tensor(rows).to(dev_);
    const at::Tensor q = p.q.index_select(1, rows_dev);
    const at::Tensor out = causal_rows_attention(q.to(spec_.dtype), next, K, V);
    x_ = m_.finish(l, x_.index_select(0, rows_dev), out.to(m_.dtype()));
    act_ = std::move(next);
    act_dev_ = index_tensor(act_).to(dev_);
    st_.computed_token_layers += static_cast<int64_t>(act_.size());
  }

  // The last layer: only the prompt's last token needs an output (its logits).
  at::Tensor last_token_logits(int l, const Qkv& p, const at::Tensor& K, const at::Tensor& V) {
    const int64_t r = static_cast<int64_t>(act_.size()) - 1;
    const at::Tensor q = p.q.narrow(1, r, 1);
    const at::Tensor out = attention(q.to(spec_.dtype), K, V, at::Tensor(), {}).out;
    const at::Tensor h = m_.finish(l, x_.narrow(0, r, 1), out.to(m_.dtype()));
    at::Tensor logits = m_.head(h).second.select(0, 0).to(at::kCPU);
    st_.computed_token_layers += 1;
    return logits;
  }

  ChunkCache& cache_;
  RecomputePolicy& policy_;
  const RecomputePlan& plan_;
  const Layout& lay_;
  Pending& pending_;
  KvWindow& window_;
  const ReuseOptions& opt_;
  ReuseStats& st_;
  LlmModelImpl& m_;
  const int L_;
  const int64_t N_;
  const at::Device dev_;
  const KvSpec& spec_;
  const std::vector<CacheUnit>& units_;
  const int U_;
  std::vector<char> cached_;      // per unit: its entry is in the cache (else pending)
  std::vector<int64_t> delta_;    // per unit: its begin minus its entry's first position
  std::vector<int64_t> carried_;  // the reused tokens recomputed at the current layer, increasing
  std::vector<int64_t> n_carried_;  // per unit: how many of its tokens are carried
  std::vector<int> unit_of_;        // per token: its unit, or -1
  int64_t fresh_memory_ = 0;        // reusable tokens no unit covers: computed at every layer
  std::optional<LayerQueueLoader> loader_;
  std::vector<std::vector<char>> queued_;          // [unit][layer]: the block is queued
  std::vector<std::vector<int>> queued_units_;     // per layer, the units of its queued blocks in order
  std::vector<std::vector<Tier>> queued_tiers_;    // and their tiers
  std::vector<char> is_check_;                     // per layer: the policy selects there
  std::vector<int64_t> act_;                       // tokens carried into the layer (carried and fresh)
  at::Tensor act_dev_;                             // act_ on the device
  at::Tensor x_;                                   // their hidden states [act_.size(), hidden]
  std::vector<int64_t> row_of_;                    // per token: its row in act_, or -1
};

// Layer by layer, the policy selecting at its check layers.
at::Tensor run_layers(ChunkCache& cache, RecomputePolicy& policy, const RecomputePlan& plan, const Layout& lay,
                      Pending& pending, KvWindow& window, const ReuseOptions& opt, ReuseStats& st) {
  return LayerwiseRun(cache, policy, plan, lay, pending, window, opt, st).run();
}

// prefix_cache: each reusable segment's in-context K/V (from the window) under its prefix key.
void store_prefixes(ChunkCache& cache, const std::vector<PromptSegment>& prompt, const Layout& lay,
                    const KvWindow& window) {
  std::vector<std::vector<int64_t>> seg_ids;
  for (const auto& s : prompt) seg_ids.push_back(s.ids);
  const std::vector<ChunkKey> keys = cache.prefix_keys(seg_ids);
  for (size_t s = 0; s < prompt.size() && prompt[s].reusable; ++s) {
    const int64_t b = lay.offsets[s], n = lay.offsets[s + 1] - b;
    if (n == 0 || cache.contains(keys[s])) continue;
    ChunkKv kv;
    for (int l = 0; l < cache.n_layers(); ++l) {
      LayerKv lk;
      lk.k = window.k(l).narrow(1, b, n).clone();
      lk.v = window.v(l).narrow(1, b, n).clone();
      lk.pos = window.pos(l).narrow(0, b, n).clone();
      lk.logw = window.logw(l).narrow(0, b, n).clone();
      kv.layers.push_back(std::move(lk));
    }
    cache.put(keys[s], kv, "prefix");
  }
}

}  // namespace

at::Tensor causal_attention_rows(const at::Tensor& q, const at::Tensor& q_pos, const at::Tensor& k) {
  WM_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(2) == k.size(2) && q.size(0) % k.size(0) == 0,
           "q [n_heads, m, d] and k [n_kv_heads, n, d] do not fit: ", q.sizes(), " and ", k.sizes());
  WM_CHECK(q_pos.dim() == 1 && q_pos.size(0) == q.size(1), "q_pos must be [", q.size(1), "], got ", q_pos.sizes());
  const int64_t H = q.size(0), m = q.size(1), d = q.size(2), KH = k.size(0), n = k.size(1), G = H / KH;
  at::Tensor out = at::zeros({m, n}, at::TensorOptions().dtype(at::kFloat).device(q.device()));
  if (m == 0) return out;
  // Keys past the last query are hidden from every query: left out of the product.
  const int64_t seen = std::min<int64_t>(n, q_pos.max().item<int64_t>() + 1);
  // Each kv head's group of query heads averaged into one query (as StepOptions::capture_query).
  const at::Tensor qg = q.to(at::kFloat).reshape({KH, G, m, d}).mean(1);  // [KH, m, d]
  at::Tensor s = at::bmm(qg, k.narrow(1, 0, seen).to(at::kFloat).transpose(1, 2))
                     .mul_(1.0 / std::sqrt(static_cast<double>(d)));  // [KH, m, seen]
  s.add_(causal_bias(q_pos, seen, q.device()).unsqueeze(0));
  out.narrow(1, 0, seen).copy_(at::softmax(s, -1).mean(0));
  return out;
}

ReuseResult prefill_with_reuse(ChunkCache& cache, RecomputePolicy& policy, const std::vector<PromptSegment>& prompt,
                               KvWindow& window, const ReuseOptions& opt) {
  at::NoGradGuard no_grad;
  check_prompt(prompt);
  WM_CHECK(opt.max_attempts >= 1, "max_attempts must be at least 1, got ", opt.max_attempts);
  const auto t0 = Clock::now();
  const RecomputePlan plan = policy.prepare(prompt, cache);
  const Layout lay = make_layout(prompt, plan);
  Pending pending;
  ReuseResult res;
  int64_t corrupt = 0;
  for (int attempt = 1;; ++attempt) {
    ReuseStats st;
    st.n_layers = cache.n_layers();
    st.prompt_tokens = lay.n;
    st.units = static_cast<int64_t>(plan.units.size());
    st.memory_tokens = lay.memory_tokens;
    st.attempts = attempt;
    window.clear();
    try {
      res.logits = plan.prefill_rest ? run_prefill(cache, plan, lay, pending, window, opt, st)
                                     : run_layers(cache, policy, plan, lay, pending, window, opt, st);
      st.corrupt += corrupt;
      res.stats = std::move(st);
      break;
    } catch (const StartOver&) {
      corrupt += st.corrupt;
      if (attempt >= opt.max_attempts)
        throw CorruptData(str_cat("prefill_with_reuse: damaged cache entries in each of ", attempt,
                                  " attempts; the last: ", cache.corrupt_reports().back()));
    }
  }
  res.stats.ttft_s = since(t0);

  // Off the first token's path: new entries stored, later prompts' blocks built.
  const auto t1 = Clock::now();
  for (auto& [key, kv] : pending) {
    std::string kind = "chunk";
    for (const auto& c : plan.units)
      if (c.key == key) kind = c.kind;
    cache.put(key, kv, kind);
  }
  if (plan.store_prefixes) store_prefixes(cache, prompt, lay, window);
  for (const auto& b : plan.build_after)
    if (!cache.contains(b.key)) cache.put(b.key, cache.prefill(b.ids), b.kind);
  res.stats.store_s = since(t1);
  return res;
}

}  // namespace wm::llm
