#pragma once
// A random Wan VAE state dict, for wm_bench_dit --lingbot-hub (the hub folder's
// Wan2.1_VAE.safetensors stand-in) and the tests that decode with a small VAE
// (tests/viewer/viewer_test.cpp: Matrix-Game-2.0's and LingBot-World-Fast's runs in the viewer).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dit/wan_vae.h"

namespace wm::bench {

// The Wan VAE (encoder and decoder) of base width `dim` with random weights under the
// checkpoint's keys, float32, drawn in the order of its parameters from one generator seeded with
// `seed`: conv weights N(0, 1 / fan_in), biases 0.05 N(0, 1), RMS gammas uniform in [0.5, 1.5]
// (decoded frames vary across the picture).
inline std::vector<std::pair<std::string, at::Tensor>> random_wan_vae(int64_t dim, uint64_t seed) {
  dit::WanVaeConfig cfg;
  cfg.dim = dim;
  dit::WanVae vae(cfg, dit::WanVaeParts::Full);
  at::Generator g = at::detail::createCPUGenerator(seed);
  std::vector<std::pair<std::string, at::Tensor>> sd;
  for (const auto& p : vae->named_parameters(true)) {
    const std::string& k = p.key();
    const at::Tensor& w = p.value();
    auto ends = [&](const std::string& t) { return k.size() >= t.size() && k.compare(k.size() - t.size(), t.size(), t) == 0; };
    if (ends("gamma"))
      sd.emplace_back(k, at::rand(w.sizes(), g).add_(0.5));
    else if (ends("bias"))
      sd.emplace_back(k, at::randn(w.sizes(), g).mul_(0.05));
    else
      sd.emplace_back(k, at::randn(w.sizes(), g).div_(std::sqrt(double(w[0].numel()))));
  }
  return sd;
}

}  // namespace wm::bench
