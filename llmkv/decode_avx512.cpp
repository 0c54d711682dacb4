// The decode kernels (decode_kernels.h) for AVX-512 F/BW/VL: 16 floats a register. Compiled with
// its own -m flags (llmkv/CMakeLists.txt); gemv.cpp calls it only on a CPU that has them.
#include "llmkv/decode_kernels.h"
#include "llmkv/quant_kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace wm::llm::gemv {
namespace {

#include "llmkv/decode_kernels.inl"

struct V512 {
  static constexpr bool kDotBf16 = false;
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
  // out[k] = sum(a[k]), bit for bit: each folded to 8 lanes, then the 8 summed together.
  static void sum8(const reg (&a)[8], float* out) {
    __m256 h[8];
    for (int k = 0; k < 8; ++k)
      h[k] = _mm256_add_ps(_mm512_castps512_ps256(a[k]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[k]), 1)));
    // Each vector's 8 lanes paired as sum() pairs them: i + (i + 4), then i + (i + 2), then 0 + 1.
    __m256 y[4];
    for (int k = 0; k < 4; ++k)
      y[k] = _mm256_add_ps(_mm256_permute2f128_ps(h[2 * k], h[2 * k + 1], 0x20), _mm256_permute2f128_ps(h[2 * k], h[2 * k + 1], 0x31));
    const __m256 w0 = _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], 0x44), _mm256_shuffle_ps(y[0], y[1], 0xEE));
    const __m256 w1 = _mm256_add_ps(_mm256_shuffle_ps(y[2], y[3], 0x44), _mm256_shuffle_ps(y[2], y[3], 0xEE));
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(w0, w1, 0x88), _mm256_shuffle_ps(w0, w1, 0xDD));
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
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

// The quantized-weight kernels' integer side: 8 int32 lanes a 256-bit register (the lanes of
// ggml's AVX2 kernels, whose arithmetic quant_kernels.inl follows), dot products by vpdpbusd.
// AVX-512 VNNI is enabled for these functions alone (gemv picks them only on a CPU that has it):
// the rest of this file must run on AVX-512 CPUs without it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#endif

#include "llmkv/quant_kernels.inl"

struct IVnni {
  using bytes = __m256i;
  using lanes = __m256i;
  using acc = __m256;
  static bytes load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static bytes nibbles(const uint8_t* p) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
  }
  static bytes lo4(bytes b) { return _mm256_and_si256(b, _mm256_set1_epi8(0x0F)); }
  static bytes hi4(bytes b) { return _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0F)); }
  static bytes sub8(bytes b) { return _mm256_sub_epi8(b, _mm256_set1_epi8(8)); }
  template <int S>
  static bytes or_hi2(bytes lo, bytes qh) {
    return _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, S), _mm256_set1_epi8(3)), 4));
  }
  static bytes splat8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static bytes bsub(bytes a, bytes b) { return _mm256_sub_epi8(a, b); }
  static void store_bytes(void* p, bytes b) { _mm256_storeu_si256(static_cast<__m256i*>(p), b); }
  static lanes dot_us(bytes u, bytes s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
  static lanes dot_ss(bytes a, bytes b) { return dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)); }
  static lanes add(lanes a, lanes b) { return _mm256_add_epi32(a, b); }
  static lanes sub(lanes a, lanes b) { return _mm256_sub_epi32(a, b); }
  static lanes mul(lanes a, lanes b) { return _mm256_mullo_epi32(a, b); }
  static lanes lanes_set1(int v) { return _mm256_set1_epi32(v); }
  static lanes halves(int lo, int hi) { return _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi); }
  static acc zero() { return _mm256_setzero_ps(); }
  static acc fma(float d, lanes l, acc a) { return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l), a); }
  static float hsum(acc x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
  }
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  // 16 bytes as 32: their low nibbles, then their high nibbles in place (kHi = 16 times their
  // value; vpdpbusd's sums are int32).
  static constexpr int kHi = 16;
  static bytes nibbles_hi(const uint8_t* p) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_and_si256(b, _mm256_setr_epi64x(0x0f0f0f0f0f0f0f0f, 0x0f0f0f0f0f0f0f0f, static_cast<int64_t>(0xf0f0f0f0f0f0f0f0),
                                                  static_cast<int64_t>(0xf0f0f0f0f0f0f0f0)));
  }
  static bytes halves8(int lo, int hi) {
    return _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(lo)), _mm_set1_epi8(static_cast<char>(hi)));
  }
  static acc unscale_hi(acc a) { return _mm256_mul_ps(a, _mm256_setr_ps(1, 1, 1, 1, 0.0625f, 0.0625f, 0.0625f, 0.0625f)); }
  // 8 words of two fp16 each: the low halves as float (returned) and the high ones (*m).
  static acc halves_to_float(const uint32_t* w, acc* m) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w));
    *m = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(v, 16)));
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v));
  }
  static acc mul_s(acc v, float s) { return _mm256_mul_ps(v, _mm256_set1_ps(s)); }
  static acc fma_s(acc v, float s, acc c) { return _mm256_fmadd_ps(v, _mm256_set1_ps(s), c); }
  static void store(float* f, acc v) { _mm256_storeu_ps(f, v); }
  static acc loadu(const float* f) { return _mm256_loadu_ps(f); }
  static float amax32(const float* x) {
    const __m512 a = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16)));
    return _mm512_reduce_max_ps(a);
  }
  static int round32(const float* x, float id, int8_t* q) {
    const __m512 s = _mm512_set1_ps(id);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x), s), kNearest));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + 16), s), kNearest));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(i1));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  }
};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// bfloat16 weights against bfloat16 x by vdpbf16ps (AVX-512 BF16): the kernels' body again,
// with AVX-512 BF16 enabled for its functions alone (gemv picks them only on a CPU that has it).
// vdpbf16ps forms each product exactly and adds it in float32, flushing subnormal inputs and
// results to zero (products under 2^-126, which float32 weights and activations of a model do
// not come near).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512bf16")
#endif

namespace bf16dot {

#include "llmkv/decode_kernels.inl"

struct V512Bf16 : V512 {
  static constexpr bool kDotBf16 = true;
  static reg dot_bf16(reg acc, const uint16_t* w, const uint16_t* x) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(w), (__m512bh)_mm512_loadu_si512(x));
  }
};

}  // namespace bf16dot

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

}  // namespace

RowsFn rows_avx512() { return &rows_impl<V512>; }
RowsFn rows_avx512_bf16() { return &bf16dot::rows_impl<bf16dot::V512Bf16>; }
AttnFn attn_avx512() { return &attn_task<V512>; }
QuantFns quant_avx512() { return {&qrows_impl<IVnni, V512>, &quantize_row<IVnni>}; }

}  // namespace wm::llm::gemv
#else
namespace wm::llm::gemv {
RowsFn rows_avx512() { return nullptr; }
RowsFn rows_avx512_bf16() { return nullptr; }
AttnFn attn_avx512() { return nullptr; }
QuantFns quant_avx512() { return {}; }
}  // namespace wm::llm::gemv
#endif
