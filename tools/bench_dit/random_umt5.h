#pragma once
// A random umT5 encoder state dict, for wm_bench_dit --lingbot-hub (the hub folder's
// models_t5_umt5-xxl-enc-bf16 stand-in) and the tests that need an encoder of a given width and
// vocabulary (tests/dit/test_umt5_prompt.cpp, the viewer's LingBot test).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dit/umt5.h"

namespace wm::bench {

// The encoder of config `c` with random weights under the checkpoint's keys, in bfloat16 as the
// hub's: token embeddings and position biases N(0, 1), linear weights N(0, 1 / fan_in),
// layer-norm weights uniform in [0.5, 1.5]. Built directly in bfloat16 (umT5-XXL's shape: 11 GB).
inline std::vector<std::pair<std::string, at::Tensor>> random_umt5(const dit::Umt5Config& c, uint64_t seed) {
  dit::Umt5Encoder enc(c, at::TensorOptions(at::kBFloat16));
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::NoGradGuard ng;
  for (const auto& item : enc->named_modules()) {
    torch::nn::Module& mod = *item.value();
    for (const auto& p : mod.named_parameters(/*recurse=*/false)) {
      at::Tensor t = p.value();
      if (mod.as<dit::Umt5LayerNormImpl>())
        t.uniform_(0.5, 1.5, g);
      else if (mod.as<dit::Umt5LinearImpl>())
        t.normal_(0.0, 1.0 / std::sqrt(double(t.size(1))), g);
      else
        t.normal_(0.0, 1.0, g);
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> sd;
  for (const auto& p : enc->named_parameters(true)) sd.emplace_back(p.key(), p.value());
  return sd;
}

// A small umT5 config: `dim` wide (dim_attn too), FFN 2 x dim, 2 heads (1 when dim is odd), 2
// blocks, 32 buckets, `vocab` rows.
inline dit::Umt5Config small_umt5_config(int64_t dim, int64_t vocab) {
  dit::Umt5Config u;
  u.vocab = vocab;
  u.dim = u.dim_attn = dim;
  u.dim_ffn = 2 * dim;
  u.num_heads = dim % 2 == 0 ? 2 : 1;
  u.num_layers = 2;
  return u;
}

}  // namespace wm::bench
