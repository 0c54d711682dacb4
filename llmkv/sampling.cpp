#include "llmkv/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/error.h"

namespace wm::llm {

void SamplingOptions::validate() const {
  WM_CHECK(std::isfinite(temperature) && temperature >= 0.0, "temperature must be a finite number >= 0, got ",
           temperature);
  WM_CHECK(top_k >= 0, "top_k must be >= 0, got ", top_k);
  WM_CHECK(std::isfinite(top_p) && top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1], got ", top_p);
}

TokenSampler::TokenSampler(SamplingOptions opt) : opt_(opt), state_(opt.seed ^ 0x9E3779B97F4A7C15ull) {
  opt_.validate();
}

double TokenSampler::uniform() {
  // splitmix64: a fixed sequence for a seed on every platform.
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

at::Tensor log_probs64(const at::Tensor& logits) {
  WM_CHECK(logits.dim() == 1, "logits must be [vocab], got ", logits.sizes());
  return at::log_softmax(logits.to(at::kCPU, at::kDouble), 0);
}

TokenLogprob token_logprob(const at::Tensor& logits, int64_t token, int64_t top) {
  WM_CHECK(top >= 0 && top <= kMaxTopLogprobs, "top must be in [0, ", kMaxTopLogprobs, "], got ", top);
  const at::Tensor lp = log_probs64(logits).contiguous();
  const int64_t V = lp.size(0);
  WM_CHECK(token >= 0 && token < V, "token ", token, " is outside the ", V, " logits");
  const double* l = lp.data_ptr<double>();
  TokenLogprob out;
  out.token = token;
  out.logprob = l[token];
  const int64_t k = std::min(top, V);
  if (k == 0) return out;
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // NaN (never: the sampler refuses such logits first) would break the order: it sorts last.
  auto cmp = [&](int64_t a, int64_t b) {
    if (std::isnan(l[b])) return !std::isnan(l[a]);
    return l[a] > l[b] || (l[a] == l[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), cmp);
  out.top.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out.top.emplace_back(order[i], l[order[i]]);
  return out;
}

int64_t TokenSampler::sample(const at::Tensor& logits_in) {
  WM_CHECK(logits_in.dim() == 1 && logits_in.size(0) > 0, "logits must be [vocab], got ", logits_in.sizes());
  at::Tensor logits = logits_in.to(at::kCPU, at::kDouble).contiguous();
  WM_CHECK(!at::isnan(logits).any().item<bool>(), "the logits contain NaN");
  const double* l = logits.data_ptr<double>();
  const int64_t V = logits.size(0);
  if (opt_.greedy()) return std::max_element(l, l + V) - l;  // the first maximum: lowest id

  // Candidates by descending logit, ties by ascending id (a stable order).
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = opt_.top_k > 0 ? std::min<int64_t>(opt_.top_k, V) : V;
  auto cmp = [&](int64_t a, int64_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), cmp);
  order.resize(k);

  const double mx = l[order[0]];
  std::vector<double> p(k);
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i) total += (p[i] = std::exp((l[order[i]] - mx) / opt_.temperature));
  // Nucleus over the top-k distribution: the smallest prefix whose mass reaches top_p.
  int64_t keep = k;
  if (opt_.top_p < 1.0) {
    double mass = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      mass += p[i] / total;
      if (mass >= opt_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept += p[i];
  double u = uniform() * kept;
  for (int64_t i = 0; i < keep; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[keep - 1];  // rounding at the very end of the mass
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopStrings::feed(const std::string& text) {
  if (stopped_) return {};
  pending_ += text;
  // The earliest complete stop string ends the generation.
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at != std::string::npos && (first == std::string::npos || at < first)) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace wm::llm
