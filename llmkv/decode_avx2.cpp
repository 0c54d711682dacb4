// The decode kernels (decode_kernels.h) for AVX2 + FMA + F16C: 8 floats a register. Compiled with
// its own -m flags (llmkv/CMakeLists.txt); gemv.cpp calls it only on a CPU that has them.
#include "llmkv/decode_kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace wm::llm::gemv {
namespace {

#include "llmkv/decode_kernels.inl"

struct V256 {
  using reg = __m256;
  static constexpr int L = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg loadx(const float* p) { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static float hmax(reg a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static void store(float* p, reg a) { _mm256_storeu_ps(p, a); }
  // e^x for x <= 0 as the AVX-512 kernels compute it, 2^n built from the exponent bits.
  static reg exp(reg x) {
    const reg lo = _mm256_set1_ps(-87.0f);
    const reg tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const reg n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    reg f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
    reg y = _mm256_set1_ps(1.f / 720);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.f / 120));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.f / 24));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.f / 6));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(0.5f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static void bf16_pairs(const void* base, int64_t e, reg& even, reg& odd) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + e));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
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
AttnFn attn_avx2() { return &attn_task<V256>; }

}  // namespace wm::llm::gemv
#else
namespace wm::llm::gemv {
RowsFn rows_avx2() { return nullptr; }
AttnFn attn_avx2() { return nullptr; }
}  // namespace wm::llm::gemv
#endif
