// The decode kernels (gemv_kernels.h) in plain C++ (one float a "register"): the path on CPUs
// without AVX2 and the reference the vector paths are tested against.
#include "llmkv/gemv_kernels.h"

namespace wm::llm::gemv {
namespace {

#include "llmkv/gemv_kernels.inl"

struct V1 {
  using reg = float;
  static constexpr int L = 1;
  static reg zero() { return 0.f; }
  static reg loadx(const float* p) { return *p; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg set1(float s) { return s; }
  static float sum(reg a) { return a; }
  template <WeightKind K>
  static reg w(const void* base, int64_t e) {
    return scalar_w<K>(base, e);
  }
};

}  // namespace

RowsFn rows_scalar() { return &rows_impl<V1>; }

}  // namespace wm::llm::gemv
