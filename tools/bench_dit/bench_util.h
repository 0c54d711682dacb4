#pragma once
// Small helpers the benchmark's modes share: wall-clock seconds, waiting for queued device work,
// and a dtype's short name.
#include <ATen/ATen.h>

#include <chrono>
#include <string>

namespace wm::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Waits for queued device work (a host read forces it on every backend).
inline void sync(const at::Tensor& t) { (void)t.sum().item<double>(); }

inline std::string dtype_name(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "f16" : "f32"; }

}  // namespace wm::bench
