#pragma once
// Chunk latency statistics: mean and percentiles over every chunk of a run.
#include <algorithm>
#include <cmath>
#include <vector>

namespace wm::viewer {

struct LatencySummary {
  size_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, min = 0, max = 0;
};

// Mean, nearest-rank percentiles, min and max of `ms` (all zero when empty).
inline LatencySummary summarize(std::vector<double> ms) {
  LatencySummary s;
  s.n = ms.size();
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  s.mean = sum / ms.size();
  auto pct = [&](double p) {
    const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * ms.size()));
    return ms[std::min(ms.size() - 1, rank > 0 ? rank - 1 : 0)];
  };
  s.p50 = pct(50);
  s.p90 = pct(90);
  s.min = ms.front();
  s.max = ms.back();
  return s;
}

}  // namespace wm::viewer
