#include "llmkv/recompute/blend.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
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

// Layer by layer, the policy selecting at its check layers.
at::Tensor run_layers(ChunkCache& cache, RecomputePolicy& policy, const RecomputePlan& plan, const Layout& lay,
                      Pending& pending, KvWindow& window, const ReuseOptions& opt, ReuseStats& st) {
  LlmModelImpl& m = cache.model();
  const int L = cache.n_layers();
  const int64_t N = lay.n;
  const at::Device dev = m.device();
  const KvSpec& spec = window.spec();
  const auto& units = plan.units;
  const int U = static_cast<int>(units.size());
  WM_CHECK(!lay.fresh.empty() && lay.fresh.back() == N - 1, "a layer-wise plan needs the prompt's last token fresh");

  // Every unit's entry: in the cache (loaded layer by layer), or prefilled alone now.
  std::vector<char> cached(U, 0);
  std::vector<int64_t> delta(U, 0);
  for (int u = 0; u < U; ++u) {
    const CacheUnit& c = units[u];
    int64_t first = 0;
    if (pending.count(c.key)) {
      first = pending.at(c.key).first_position();
    } else if (cache.lookup(c.key)) {
      cached[u] = 1;
      first = cache.first_position(c.key);
    } else {
      pending[c.key] = cache.prefill(lay.unit_ids[u]);
      st.prefilled_tokens += c.n_tokens();
      st.misses += 1;
    }
    delta[u] = c.begin - first;
    WM_CHECK(!c.exact || delta[u] == 0, "unit ", u, " is marked exact but its entry starts at position ", first,
             ", the unit at ", c.begin);
  }

  // The reused tokens carried through the layers (recomputed): every non-exact unit's at first.
  std::vector<int64_t> carried;
  std::vector<int64_t> n_carried(U, 0);
  std::vector<int> unit_of(N, -1);
  for (int u = 0; u < U; ++u) {
    for (int64_t i = units[u].begin; i < units[u].end; ++i) unit_of[i] = u;
    if (units[u].exact) continue;
    for (int64_t i = units[u].begin; i < units[u].end; ++i) carried.push_back(i);
    n_carried[u] = units[u].n_tokens();
  }
  st.reused_tokens = 0;
  for (const auto& c : units) st.reused_tokens += c.n_tokens();
  st.fresh_tokens = N - st.reused_tokens;
  int64_t fresh_memory = 0;  // reusable tokens no unit covers: computed at every layer
  for (int64_t i : lay.fresh) fresh_memory += lay.reusable[i];

  // Loading: a unit's layer-l block is needed when some of its tokens are not carried at l (once
  // dropped, never carried again), or when the plan compares cached and fresh K/V.
  LayerQueueLoader loader(cache.store(), L, dev, plan.balanced_loading ? -1 : 1, opt.load_bytes_per_s);
  std::vector<std::vector<char>> queued(U, std::vector<char>(L, 0));
  std::vector<std::vector<int>> queued_units(L);
  std::vector<std::vector<Tier>> queued_tiers(L);
  auto needed = [&](int u, int l) {
    return units[u].exact || n_carried[u] < units[u].n_tokens() || (plan.cached_of_recomputed && l >= 1);
  };
  auto queue_from = [&](int from) {
    for (int l = from; l < L; ++l) {
      std::vector<std::string> ids;
      for (int u = 0; u < U; ++u) {
        if (!cached[u] || queued[u][l] || !needed(u, l)) continue;
        queued[u][l] = 1;
        ids.push_back(cache.block_id(units[u].key, l));
        queued_units[l].push_back(u);
        queued_tiers[l].push_back(cache.tier_of(units[u].key, l));
      }
      if (!ids.empty()) loader.enqueue(l, ids);
    }
  };
  queue_from(0);

  std::vector<char> is_check(L, 0);
  for (int c : plan.check_layers)
    if (c >= 0 && c < L - 1) is_check[c] = 1;

  const at::Tensor ids = index_tensor(lay.ids);
  const at::Tensor pos_all = at::arange(N, at::kLong);
  const at::Tensor pos_window = pos_all.unsqueeze(1);
  const auto [cos, sin] = m.rope_cos_sin(pos_all);
  const auto kv_opts = at::TensorOptions().dtype(spec.dtype).device(dev);
  const int64_t KH = spec.n_kv_heads, D = spec.head_dim;

  std::vector<int64_t> act = merge_sorted(carried, lay.fresh);  // tokens carried into the layer
  at::Tensor act_dev = index_tensor(act).to(dev);
  at::Tensor x = m.embed(ids.index_select(0, index_tensor(act)));
  std::vector<int64_t> row_of(N, -1);
  at::Tensor logits;
  for (int l = 0; l < L; ++l) {
    LayerQueueLoader::Loaded ld = loader.wait(l);
    bool damaged = false;
    for (size_t j = 0; j < ld.errors.size(); ++j) {
      if (!ld.errors[j]) continue;
      try {
        std::rethrow_exception(ld.errors[j]);
      } catch (const CorruptData& e) {
        cache.report_corrupt(units[queued_units[l][j]].key, e.what());
        st.corrupt += 1;
        damaged = true;
      }
    }
    if (damaged) throw StartOver{};

    // The cache's K/V for this layer, re-anchored to the units' offsets.
    std::vector<at::Tensor> ks, vs;
    std::vector<int64_t> dst, shift;
    bool moves = false;
    auto add = [&](int u, const LayerKv& kv) {
      WM_CHECK(kv.n_tokens() == units[u].n_tokens(), "entry ", key_hex(units[u].key), " holds ", kv.n_tokens(),
               " tokens at layer ", l, ", its unit ", units[u].n_tokens());
      ks.push_back(kv.k);
      vs.push_back(kv.v);
      for (int64_t i = units[u].begin; i < units[u].end; ++i) dst.push_back(i), shift.push_back(delta[u]);
      moves = moves || delta[u] != 0;
    };
    for (size_t j = 0; j < ld.blocks.size(); ++j) {
      const int u = queued_units[l][j];
      add(u, ld.blocks[j].layers.at(0));
      st.loaded_token_layers[static_cast<int>(queued_tiers[l][j])] += units[u].n_tokens();
    }
    for (int u = 0; u < U; ++u)
      if (!cached[u] && needed(u, l)) add(u, pending.at(units[u].key).layers[l]);
    at::Tensor K = at::zeros({KH, N, D}, kv_opts), V = at::zeros({KH, N, D}, kv_opts);
    std::vector<char> covered(N, 0);
    if (!ks.empty()) {
      at::Tensor kc = at::cat(ks, 1).to(spec.dtype), vc = at::cat(vs, 1).to(spec.dtype);
      if (moves) kc = apply_rope(kc, index_tensor(shift).unsqueeze(1), spec.rope);
      const at::Tensor dst_t = index_tensor(dst).to(dev);
      K.index_copy_(1, dst_t, kc);
      V.index_copy_(1, dst_t, vc);
      for (int64_t i : dst) covered[i] = 1;
    }
    for (int64_t i : act) covered[i] = 1;
    for (int64_t i = 0; i < N; ++i)
      WM_CHECK(covered[i], "layer ", l, ": token ", i, " is neither computed nor loaded (unit ", unit_of[i], ")");

    // The carried tokens' K/V at this layer replace the cached ones.
    std::fill(row_of.begin(), row_of.end(), -1);
    for (size_t r = 0; r < act.size(); ++r) row_of[act[r]] = static_cast<int64_t>(r);
    const Qkv p = m.project(l, x, cos.index_select(0, act_dev), sin.index_select(0, act_dev));
    at::Tensor carried_rows_dev;
    if (is_check[l]) {
      std::vector<int64_t> rows;
      rows.reserve(carried.size());
      for (int64_t i : carried) rows.push_back(row_of[i]);
      carried_rows_dev = index_tensor(rows).to(dev);
    }
    at::Tensor ck, cv;
    if (is_check[l] && plan.cached_of_recomputed && l >= 1 && !carried.empty()) {
      const at::Tensor c_dev = index_tensor(carried).to(dev);
      ck = K.index_select(1, c_dev);
      cv = V.index_select(1, c_dev);
    }
    K.index_copy_(1, act_dev, p.k.to(spec.dtype));
    V.index_copy_(1, act_dev, p.v.to(spec.dtype));
    if (l >= 1) st.recomputed_token_layers += static_cast<int64_t>(carried.size()) + fresh_memory;

    if (is_check[l]) {
      View view(l, L, N, units, carried, lay.fresh, row_of, p.q, K, p.k.index_select(1, carried_rows_dev),
                p.v.index_select(1, carried_rows_dev), ck, cv);
      std::vector<int64_t> keep = policy.select(view);
      std::sort(keep.begin(), keep.end());
      keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
      std::vector<int64_t> next_n(U, 0);
      for (int64_t i : keep) {
        WM_CHECK(i >= 0 && i < N && unit_of[i] >= 0 && std::binary_search(carried.begin(), carried.end(), i),
                 policy.name(), " selected token ", i, " at layer ", l, ", which is not being recomputed");
        next_n[unit_of[i]] += 1;
      }
      carried = std::move(keep);
      n_carried = std::move(next_n);
      queue_from(l + 1);
    }

    if (l < L - 1) {
      std::vector<int64_t> next = merge_sorted(carried, lay.fresh), rows;
      rows.reserve(next.size());
      for (int64_t i : next) rows.push_back(row_of[i]);
      const at::Tensor rows_dev = index_tensor(rows).to(dev);
      const at::Tensor q = p.q.index_select(1, rows_dev);
      const at::Tensor out = causal_rows_attention(q.to(spec.dtype), next, K, V);
      x = m.finish(l, x.index_select(0, rows_dev), out.to(m.dtype()));
      act = std::move(next);
      act_dev = index_tensor(act).to(dev);
      st.computed_token_layers += static_cast<int64_t>(act.size());
    } else {
      // The last layer: only the prompt's last token needs an output (its logits).
      const int64_t r = static_cast<int64_t>(act.size()) - 1;
      const at::Tensor q = p.q.narrow(1, r, 1);
      const at::Tensor out = attention(q.to(spec.dtype), K, V, at::Tensor(), {}).out;
      const at::Tensor h = m.finish(l, x.narrow(0, r, 1), out.to(m.dtype()));
      logits = m.head(h).second.select(0, 0).to(at::kCPU);
      st.computed_token_layers += 1;
    }
    append_layer(window, opt.region, l, K, V, pos_window);
  }
  const LayerQueueLoader::Stats ls = loader.finish();
  st.loader_idle_s = ls.idle_s;
  st.loader_stall_s = ls.stall_s;
  st.loader_busy_s = ls.busy_s;
  st.loaded_bytes = ls.bytes;
  return logits;
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
