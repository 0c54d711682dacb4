// The decode kernels (gemv_kernels.h) for AVX2 + FMA + F16C: 8 floats a register. Compiled with
// its own -m flags (llmkv/CMakeLists.txt); gemv.cpp calls it only on a CPU that has them.
#include "llmkv/gemv_kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace wm::llm::gemv {
namespace {

#include "llmkv/gemv_kernels.inl"

struct V256 {
  using reg = __m256;
  static constexpr int L = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg loadx(const float* p) { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg set1(float s) { return _mm256_set1_ps(s); }
  static float sum(reg a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  template <WeightKind K>
  static reg w(const void* base, int64_t e) {
    if constexpr (K == WeightKind::F32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + e);
    } else if constexpr (K == WeightKind::BF16) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + e));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else if constexpr (K == WeightKind::F16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + e)));
    } else {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + e));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    }
  }
};

}  // namespace

RowsFn rows_avx2() { return &rows_impl<V256>; }

}  // namespace wm::llm::gemv
#else
namespace wm::llm::gemv {
RowsFn rows_avx2() { return nullptr; }
}  // namespace wm::llm::gemv
#endif
