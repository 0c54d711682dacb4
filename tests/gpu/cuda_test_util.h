#pragma once
// Helpers of the CUDA suites (tests/gpu and the device-parameterised conformance tests): the
// skip where no GPU is visible, and the comparison against the CPU reference.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>

namespace wm::test {

// True when this libtorch was built with CUDA and sees a device.
inline bool cuda_visible() { return at::hasCUDA(); }

// max |a - b| / max |b| over both tensors taken to the CPU in float64 (|a - b| when b is zero).
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kCPU, at::kDouble), y = b.to(at::kCPU, at::kDouble);
  const double scale = y.abs().max().item<double>();
  const double diff = (x - y).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace wm::test

// Skips the calling test, saying why, unless a CUDA device is visible.
#define WM_REQUIRE_CUDA()                                                                       \
  do {                                                                                          \
    if (!::wm::test::cuda_visible())                                                            \
      GTEST_SKIP() << "needs a CUDA device: this libtorch has no CUDA or no GPU is visible";    \
  } while (0)
