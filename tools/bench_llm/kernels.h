// wm_bench_llm --kernels: the linear layers' kernels on SmolLM2-135M's shapes (hidden 576, kv 192,
// FFN 1536, vocab 49152): GGUF blocks (Q4_1 projections, the Q8_0 embedding as the tied head), or
// Qwen2-0.5B's (hidden 896, kv 128, FFN 4864, vocab 151936) in Q8_0, with 8-bit and float32
// activations (llmkv/quant_gemv.h) against float32 and int8 weights
// (llmkv/gemv.h), per product and per decode step or prompt.
//
// Each figure is the median over rounds (after one warm-up round) of the time of one product;
// the kinds alternate inside each round (the machine is shared and noisy: ratios measured side by
// side). Decode-sized products (8 rows or fewer) cycle through copies of the weight that together
// exceed the last-level cache, so that each reads its weights from memory as a decode step's
// products do; GB/s counts the weights' bytes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace wm::bench {

struct KernelBenchOptions {
  std::vector<int64_t> rows = {1, 512};  // rows of x a product
  std::vector<int> threads = {1, 2};
  int rounds = 5;
  std::string shapes = "smollm2";  // smollm2 (Q4_1, the Q8_0 head) or qwen2-0.5b (Q8_0)
  std::string gguf;  // SmolLM2's GGUF file for real blocks (blk.0's and token_embd); empty: random blocks
  uint64_t seed = 0;
};

// Runs the figures and prints their tables on stdout; returns them as JSON rows. Throws wm::Error
// on a bad option or a GGUF file without SmolLM2's tensors.
nlohmann::json bench_kernels(const KernelBenchOptions& o);

}  // namespace wm::bench
