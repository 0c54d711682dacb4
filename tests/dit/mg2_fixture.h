#pragma once
// Helpers of the Matrix-Game-2.0 conformance tests: the deterministic inputs the fixture script
// (tools/mg2_fixtures/make_dit_fixtures.py) generates, and the fixtures' subsampling.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace wm::test {

// fixture_uniform(seed, shape): element i (row-major) is splitmix64((seed << 32) + i) mapped to
// [-sqrt(3), sqrt(3)) (unit variance), computed in float64, stored as float32.
inline at::Tensor fixture_uniform(uint64_t seed, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  float* p = out.data_ptr<float>();
  const double r3 = std::sqrt(3.0);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (seed << 32) + uint64_t(i) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
    const double u = double(z >> 11) * (1.0 / 9007199254740992.0);
    p[i] = float((2.0 * u - 1.0) * r3);
  }
  return out.view(shape);
}

// max |a - b| / max |b| (0 when both are zero).
inline double rel_max_diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kCPU, at::kDouble), y = b.to(at::kCPU, at::kDouble);
  const double scale = y.abs().max().item<double>();
  const double diff = (x - y).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace wm::test
