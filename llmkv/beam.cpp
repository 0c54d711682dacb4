#include "llmkv/beam.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "llmkv/sampling.h"
#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/window.h"

namespace wm::llm {

BeamKvCache::BeamKvCache(const KvSpec& spec, int n_beams, int64_t capacity)
    : spec_(spec), n_beams_(n_beams), capacity_(capacity) {
  WM_CHECK(n_beams > 0 && capacity > 0, "n_beams and capacity must be > 0, got ", n_beams, ", ", capacity);
  for (int l = 0; l < spec.n_layers; ++l) {
    k_.push_back(at::zeros({capacity, n_beams, spec.n_kv_heads, spec.head_dim}, spec.options()));
    v_.push_back(at::zeros({capacity, n_beams, spec.n_kv_heads, spec.head_dim}, spec.options()));
  }
  table_ = at::zeros({n_beams, capacity}, at::kLong);
}

void BeamKvCache::write_prefix(int l, const at::Tensor& k, const at::Tensor& v) {
  WM_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.size(0) == spec_.n_kv_heads && k.size(2) == spec_.head_dim,
           "prefix k ", k.sizes(), " and v ", v.sizes(), " must be [", spec_.n_kv_heads, ", n, ", spec_.head_dim, "]");
  const int64_t n = k.size(1);
  WM_CHECK(n <= capacity_, "a prefix of ", n, " tokens does not fit a capacity of ", capacity_);
  // [KH, n, d] -> rows [n, KH, d] of beam 0.
  k_.at(l).narrow(0, 0, n).select(1, 0).copy_(k.transpose(0, 1));
  v_.at(l).narrow(0, 0, n).select(1, 0).copy_(v.transpose(0, 1));
  table_.narrow(1, 0, n).zero_();
}

void BeamKvCache::write(int l, int64_t t, const at::Tensor& k, const at::Tensor& v) {
  WM_CHECK(t >= 0 && t < capacity_, "position ", t, " outside the capacity ", capacity_);
  WM_CHECK(k.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == n_beams_ && k.size(2) == 1,
           "k ", k.sizes(), " and v ", v.sizes(), " must be [", n_beams_, ", n_kv_heads, 1, head_dim]");
  k_.at(l).select(0, t).copy_(k.select(2, 0));
  v_.at(l).select(0, t).copy_(v.select(2, 0));
  table_.select(1, t).copy_(at::arange(n_beams_, at::kLong));
}

std::pair<at::Tensor, at::Tensor> BeamKvCache::gather(int l, int64_t n) const {
  WM_CHECK(n > 0 && n <= capacity_, "n ", n, " outside (0, ", capacity_, "]");
  // Row index into the flattened [capacity * n_beams] axis: position * n_beams + table[b, j].
  at::Tensor idx = (at::arange(n, at::kLong).unsqueeze(0) * n_beams_ + table_.narrow(1, 0, n)).reshape({-1});
  idx = idx.to(k_.at(l).device());
  const int64_t KH = spec_.n_kv_heads, d = spec_.head_dim;
  auto pick = [&](const at::Tensor& buf) {
    return buf.view({capacity_ * n_beams_, KH, d}).index_select(0, idx).view({n_beams_, n, KH, d})
        .permute({0, 2, 1, 3}).contiguous();
  };
  return {pick(k_.at(l)), pick(v_.at(l))};
}

void BeamKvCache::reorder(const std::vector<int64_t>& parents, int64_t n) {
  WM_CHECK(static_cast<int>(parents.size()) == n_beams_, "parents must have ", n_beams_, " entries, got ",
           parents.size());
  for (int64_t p : parents) WM_CHECK(p >= 0 && p < n_beams_, "parent ", p, " out of range");
  WM_CHECK(n >= 0 && n <= capacity_, "n ", n, " outside [0, ", capacity_, "]");
  if (n == 0) return;
  at::Tensor par = at::tensor(parents, at::kLong);
  at::Tensor rows = table_.narrow(1, 0, n).index_select(0, par);
  table_.narrow(1, 0, n).copy_(rows);
}

size_t BeamKvCache::bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += (k_[l].numel() + v_[l].numel()) * k_[l].element_size();
  return b;
}

void BeamOptions::validate() const {
  WM_CHECK(num_beams > 0, "num_beams must be > 0, got ", num_beams);
  WM_CHECK(max_new_tokens > 0, "max_new_tokens must be > 0, got ", max_new_tokens);
  WM_CHECK(std::isfinite(length_penalty), "length_penalty must be finite, got ", length_penalty);
  WM_CHECK(prefill_chunk > 0, "prefill_chunk must be > 0, got ", prefill_chunk);
}

namespace {

struct Live {
  std::vector<int64_t> tokens;
  double score = 0.0;
};

// The caches the two searches differ by. Each provides: prefix(window), reorder(parents, n),
// attend(l, q, k, v, n) -> attention output for the beams' new tokens at position n - 1.
struct TableCache {
  BeamKvCache cache;
  size_t copied = 0;
  TableCache(const KvSpec& spec, int beams, int64_t cap) : cache(spec, beams, cap) {}
  void prefix(const KvWindow& w) {
    for (int l = 0; l < w.spec().n_layers; ++l) cache.write_prefix(l, w.k(l), w.v(l));
  }
  void reorder(const std::vector<int64_t>& parents, int64_t n) { cache.reorder(parents, n); }
  std::pair<at::Tensor, at::Tensor> append(int l, int64_t t, const at::Tensor& k, const at::Tensor& v) {
    cache.write(l, t, k, v);
    return cache.gather(l, t + 1);
  }
  size_t bytes() const { return cache.bytes(); }
};

struct CopyCache {
  // Per beam, per layer: K, V [n_kv_heads, n, head_dim].
  std::vector<std::vector<at::Tensor>> k, v;
  size_t copied = 0;
  int beams;
  CopyCache(const KvSpec&, int beams_, int64_t) : beams(beams_) {}
  void prefix(const KvWindow& w) {
    k.assign(beams, {});
    v.assign(beams, {});
    for (int b = 0; b < beams; ++b)
      for (int l = 0; l < w.spec().n_layers; ++l) {
        k[b].push_back(w.k(l).clone());
        v[b].push_back(w.v(l).clone());
      }
  }
  void reorder(const std::vector<int64_t>& parents, int64_t) {
    std::vector<std::vector<at::Tensor>> nk(beams), nv(beams);
    for (int b = 0; b < beams; ++b)
      for (size_t l = 0; l < k[parents[b]].size(); ++l) {
        nk[b].push_back(k[parents[b]][l].clone());
        nv[b].push_back(v[parents[b]][l].clone());
        copied += (nk[b][l].numel() + nv[b][l].numel()) * nk[b][l].element_size();
      }
    k.swap(nk);
    v.swap(nv);
  }
  std::pair<at::Tensor, at::Tensor> append(int l, int64_t, const at::Tensor& kn, const at::Tensor& vn) {
    std::vector<at::Tensor> ks, vs;
    for (int b = 0; b < beams; ++b) {
      k[b][l] = at::cat({k[b][l], kn[b]}, 1);
      v[b][l] = at::cat({v[b][l], vn[b]}, 1);
      ks.push_back(k[b][l]);
      vs.push_back(v[b][l]);
    }
    return {at::stack(ks), at::stack(vs)};
  }
  size_t bytes() const {
    size_t s = 0;
    for (auto& beam : k)
      for (auto& t : beam) s += 2 * t.numel() * t.element_size();
    return s;
  }
};

// The prompt, once, in chunks of opt.prefill_chunk into `window`: the last position's logits.
at::Tensor prefill_prompt(LlmModelImpl& model, const std::vector<int64_t>& prompt, const BeamOptions& opt, at::Device device,
                   KvWindow& window) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  at::Tensor ids = at::tensor(prompt, at::kLong);
  at::Tensor last_logits;
  for (int64_t s = 0; s < n_prompt; s += opt.prefill_chunk) {
    const int64_t c = std::min(opt.prefill_chunk, n_prompt - s);
    StepOptions so;
    so.region = "prompt";
    so.segment = "prompt";
    last_logits = model.step(ids.narrow(0, s, c).to(device), at::arange(s, s + c, at::kLong), window, so).logits;
  }
  return last_logits;
}

// The `top` best (beam, token) candidates as flat indices beam * V + token, best first (ties in
// (beam, token) order); *flat gets every candidate's score, the beam's plus the token's log-prob.
std::vector<int64_t> best_candidates(const at::Tensor& logp, const std::vector<Live>& live, int64_t top,
                                     at::Tensor* flat) {
  std::vector<double> scores;
  for (auto& b : live) scores.push_back(b.score);
  const at::Tensor cand = logp + at::tensor(scores, at::kDouble).unsqueeze(1);
  *flat = cand.reshape({-1}).contiguous();
  const double* fs = flat->data_ptr<double>();
  std::vector<int64_t> order(flat->numel());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top, order.end(),
                    [&](int64_t a, int64_t b) { return fs[a] > fs[b] || (fs[a] == fs[b] && a < b); });
  return order;
}

template <class Cache>
BeamResult search(LlmModelImpl& model, const std::vector<int64_t>& prompt, const BeamOptions& opt, at::Device device,
                  at::ScalarType dtype) {
  opt.validate();
  WM_CHECK(!prompt.empty(), "the prompt is empty");
  torch::NoGradGuard no_grad;
  const int B = opt.num_beams;
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const KvSpec spec = model.kv_spec(device, dtype);

  KvWindow window(spec, {"prompt"}, n_prompt);
  const at::Tensor last_logits = prefill_prompt(model, prompt, opt, device, window);
  Cache cache(spec, B, n_prompt + opt.max_new_tokens);
  cache.prefix(window);

  auto is_eos = [&](int64_t t) {
    return std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), t) != opt.eos_token_ids.end();
  };
  auto ranked = [&](double score, size_t len) {
    return score / std::pow(static_cast<double>(std::max<size_t>(len, 1)), opt.length_penalty);
  };

  std::vector<Live> live(1);  // one beam before the first step
  at::Tensor logp = log_probs64(last_logits.reshape({-1})).unsqueeze(0);  // [n_live, V] float64
  std::vector<BeamHypothesis> done;
  bool ran_out = false;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    const int64_t V = logp.size(1);
    // Enough candidates that B of them continue even when every end token ranks among the best.
    const int64_t n_eos = static_cast<int64_t>(opt.eos_token_ids.size());
    const int64_t top = std::min<int64_t>(std::max<int64_t>(2, 1 + n_eos) * B, logp.numel());
    at::Tensor flat;
    const std::vector<int64_t> order = best_candidates(logp, live, top, &flat);
    const double* fs = flat.data_ptr<double>();

    std::vector<Live> next;
    std::vector<int64_t> parents, tokens;
    for (int64_t r = 0; r < top && static_cast<int>(next.size()) < B; ++r) {
      const int64_t parent = order[r] / V, tok = order[r] % V;
      std::vector<int64_t> seq = live[parent].tokens;
      seq.push_back(tok);
      if (is_eos(tok)) {
        // Ranked by the generated length without the end token.
        if (r < B) done.push_back({seq, fs[order[r]], ranked(fs[order[r]], seq.size() - 1), true});
        continue;
      }
      next.push_back({seq, fs[order[r]]});
      parents.push_back(parent);
      tokens.push_back(tok);
    }
    if (static_cast<int>(done.size()) >= B) break;  // B finished: the search is over
    WM_CHECK(static_cast<int>(next.size()) == B, "a vocabulary of ", V, " tokens with ", n_eos,
             " end tokens cannot feed ", B, " beams");
    live = next;
    if (step + 1 == opt.max_new_tokens) {  // out of tokens: the open beams compete too
      ran_out = true;
      break;  // (the last tokens need no forward pass)
    }

    // One forward pass for the B new tokens at position n_prompt + step.
    const int64_t t = n_prompt + step;
    cache.reorder(parents, t);
    at::Tensor pos = at::full({1}, t, at::kLong);
    at::Tensor x = model.embed(at::tensor(tokens, at::kLong).to(device).unsqueeze(1));  // [B, 1, hidden]
    for (int l = 0; l < spec.n_layers; ++l) {
      Qkv qkv = model.project(l, x, pos);  // q [B, H, 1, d], k, v [B, KH, 1, d]
      auto [K, Vv] = cache.append(l, t, qkv.k, qkv.v);
      at::Tensor o = attention(qkv.q, K, Vv, at::Tensor(), AttentionOptions{}).out;
      x = model.finish(l, x, o);
    }
    logp = at::log_softmax(model.head(x).second.reshape({B, -1}).to(at::kCPU, at::kDouble), 1);
  }
  // At the token limit, the beams still open compete with the finished ones on their ranked score.
  if (ran_out)
    for (auto& b : live) done.push_back({b.tokens, b.score, ranked(b.score, b.tokens.size()), false});
  std::stable_sort(done.begin(), done.end(),
                   [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.ranked > b.ranked; });
  if (static_cast<int>(done.size()) > B) done.resize(B);
  BeamResult res;
  res.beams = std::move(done);
  res.cache_bytes = cache.bytes();
  res.bytes_copied = cache.copied;
  return res;
}

}  // namespace

BeamResult beam_search(LlmModelImpl& model, const std::vector<int64_t>& prompt, const BeamOptions& opt,
                       at::Device device, at::ScalarType dtype) {
  return search<TableCache>(model, prompt, opt, device, dtype);
}

BeamResult beam_search_copying(LlmModelImpl& model, const std::vector<int64_t>& prompt, const BeamOptions& opt,
                               at::Device device, at::ScalarType dtype) {
  return search<CopyCache>(model, prompt, opt, device, dtype);
}

}  // namespace wm::llm
