#pragma once
// Small statistics the benchmark programs print. Header-only; every program may use it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace wm::cli {

// Wilson score interval (95%) of k successes in n trials, as fractions; {0, 0} for n = 0.
inline std::pair<double, double> wilson95(int64_t k, int64_t n) {
  if (n <= 0) return {0.0, 0.0};
  const double z = 1.959963984540054, p = static_cast<double>(k) / static_cast<double>(n);
  const double nn = static_cast<double>(n);
  const double den = 1 + z * z / nn, c = (p + z * z / (2.0 * nn)) / den;
  const double h = z * std::sqrt(p * (1 - p) / nn + z * z / (4.0 * nn * nn)) / den;
  return {std::max(0.0, c - h), std::min(1.0, c + h)};
}

}  // namespace wm::cli
