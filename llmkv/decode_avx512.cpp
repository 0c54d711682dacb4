// The decode kernels (decode_kernels.h) for AVX-512 F/BW/VL: 16 floats a register. Compiled with
// its own -m flags (llmkv/CMakeLists.txt); gemv.cpp calls it only on a CPU that has them.
#include "llmkv/decode_kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace wm::llm::gemv {
namespace {

#include "llmkv/decode_kernels.inl"

struct V512 {
  using reg = __m512;
  static constexpr int L = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg loadx(const float* p) { return _mm512_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static float hmax(reg a) { return _mm512_reduce_max_ps(a); }
  static void store(float* p, reg a) { _mm512_storeu_ps(p, a); }
  // e^x for x <= 0 (the softmax's shifted scores): 2^n e^f, |f| <= ln2 / 2, a degree-6 Taylor
  // polynomial (relative error below 2e-7); e^x under -87 flushes to 0.
  static reg exp(reg x) {
    const reg lo = _mm512_set1_ps(-87.0f);
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    const reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    reg f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
    reg y = _mm512_set1_ps(1.f / 720);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f / 120));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f / 24));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f / 6));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.5f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(y, n));
  }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static void bf16_pairs(const void* base, int64_t e, reg& even, reg& odd) {
    const __m512i raw = _mm512_loadu_si512(static_cast<const uint16_t*>(base) + e);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static reg set1(float s) { return _mm512_set1_ps(s); }
  static float sum(reg a) { return _mm512_reduce_add_ps(a); }
  template <WeightKind K>
  static reg w(const void* base, int64_t e) {
    if constexpr (K == WeightKind::F32) {
      return _mm512_loadu_ps(static_cast<const float*>(base) + e);
    } else if constexpr (K == WeightKind::BF16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + e));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else if constexpr (K == WeightKind::F16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + e)));
    } else {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + e));
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
    }
  }
};

}  // namespace

RowsFn rows_avx512() { return &rows_impl<V512>; }
AttnFn attn_avx512() { return &attn_task<V512>; }

}  // namespace wm::llm::gemv
#else
namespace wm::llm::gemv {
RowsFn rows_avx512() { return nullptr; }
AttnFn attn_avx512() { return nullptr; }
}  // namespace wm::llm::gemv
#endif
