#pragma once
// The deterministic inputs of the Matrix-Game-2.0 conformance fixtures, for wm_bench_dit's
// full-size check and the conformance tests (tests/dit/mg2_fixture.h). This mirrors the generator of
// tools/mg2_fixtures/make_dit_fixtures.py (fixture_uniform, make_inputs); keep the three in step.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace wm::bench {

// fixture_uniform(seed, shape): element i (row-major) is splitmix64((seed << 32) + i) mapped to
// [-sqrt(3), sqrt(3)) (unit variance), computed in float64, stored as float32 on the CPU.
inline at::Tensor fixture_uniform(uint64_t seed, const std::vector<int64_t>& shape) {
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

// The fixture script's rollout inputs (9 latent frames) in the C++ layouts.
struct FixtureInputs {
  at::Tensor noise;  // [9, 16, 44, 80]: fixture_uniform(1, [1, 16, 9, 44, 80]) frame-major
  at::Tensor cond;   // [9, 20, 44, 80]: mask (1 at latent frame 0) | fixture_uniform(2, ...)
  at::Tensor clip;   // [257, 1280]: fixture_uniform(3, [1, 257, 1280])
};

inline FixtureInputs fixture_inputs() {
  FixtureInputs in;
  in.noise = fixture_uniform(1, {1, 16, 9, 44, 80})[0].permute({1, 0, 2, 3}).contiguous();
  at::Tensor img = fixture_uniform(2, {1, 16, 9, 44, 80})[0].permute({1, 0, 2, 3});
  at::Tensor mask = at::zeros({9, 4, 44, 80});
  mask[0].fill_(1.0);
  in.cond = at::cat({mask, img}, 1).contiguous();
  in.clip = fixture_uniform(3, {1, 257, 1280})[0];
  return in;
}

// The fixture script's actions (make_actions) for 33 video frames: keyboard [33, kd] multi-hot
// (templerun: one-hot), mouse [33, 2] (pitch, yaw in {-0.1, 0, 0.1}; undefined for templerun).
struct FixtureActions {
  at::Tensor keyboard, mouse;
};

inline FixtureActions fixture_actions(bool templerun, int64_t kd) {
  const int64_t n = 33;
  FixtureActions a;
  a.keyboard = at::zeros({n, kd});
  auto kb = a.keyboard.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    if (templerun) {
      kb[i][(i / 3 + 2 * (i % 2)) % kd] = 1.0f;
    } else {
      const bool held[4] = {(i / 5) % 2 == 0, (i % 7) >= 4, ((i + 2) / 3) % 3 == 0, (i / 4) % 3 == 1};
      for (int64_t j = 0; j < kd && j < 4; ++j) kb[i][j] = held[j] ? 1.0f : 0.0f;
    }
  }
  if (templerun) return a;
  a.mouse = at::zeros({n, 2});
  auto ms = a.mouse.accessor<float, 2>();
  const float step[3] = {-0.1f, 0.0f, 0.1f};
  for (int64_t i = 0; i < n; ++i) {
    ms[i][0] = step[(i / 4) % 3];      // pitch
    ms[i][1] = step[(i / 3 + 1) % 3];  // yaw
  }
  return a;
}

}  // namespace wm::bench
