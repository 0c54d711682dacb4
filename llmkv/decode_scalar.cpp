// The decode kernels (decode_kernels.h) in plain C++ (one float a "register"): the path on CPUs
// without AVX2 and the reference the vector paths are tested against.
#include "llmkv/decode_kernels.h"

namespace wm::llm::gemv {
namespace {

#include "llmkv/decode_kernels.inl"

struct V1 {
  using reg = float;
  static constexpr int L = 1;
  static reg zero() { return 0.f; }
  static reg loadx(const float* p) { return *p; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg max(reg a, reg b) { return a > b ? a : b; }
  static float hmax(reg a) { return a; }
  static void store(float* p, reg a) { *p = a; }
  static reg exp(reg x) { return __builtin_expf(x); }
  static reg mul(reg a, reg b) { return a * b; }
  static void bf16_pairs(const void* base, int64_t e, reg& even, reg& odd) {
    even = scalar_w<WeightKind::BF16>(base, e);
    odd = scalar_w<WeightKind::BF16>(base, e + 1);
  }
  static reg set1(float s) { return s; }
  static float sum(reg a) { return a; }
  template <WeightKind K>
  static reg w(const void* base, int64_t e) {
    return scalar_w<K>(base, e);
  }
};

}  // namespace

RowsFn rows_scalar() { return &rows_impl<V1>; }
AttnFn attn_scalar() { return &attn_task<V1>; }

}  // namespace wm::llm::gemv
