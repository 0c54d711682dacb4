// The decode kernels (decode_kernels.h) for AVX2 + FMA + F16C: 8 floats a register. Compiled with
// its own -m flags (llmkv/CMakeLists.txt); gemv.cpp calls it only on a CPU that has them.
#include "llmkv/decode_kernels.h"
#include "llmkv/quant_kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace wm::llm::gemv {
namespace {

#include "llmkv/decode_kernels.inl"

struct V256 {
  static constexpr bool kDotBf16 = false;
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
  // out[k] = sum(h[k]), bit for bit, the 8 summed together.
  static void sum8(const reg (&h)[8], float* out) {
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

#include "llmkv/quant_kernels.inl"

// The quantized-weight kernels' integer side: ggml's AVX2 kernels' own operations (maddubs, then
// madd by ones into 8 int32 lanes).
struct I256 {
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
  // u <= 128 and |s| <= 127 in every use: a pair's sum stays inside maddubs' int16 saturation.
  static lanes dot_us(bytes u, bytes s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }
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
  // 16 bytes as 32: their low nibbles, then their high nibbles (kHi times their value: 1 here,
  // where a dot's pair sums are int16 and would saturate at 16 times).
  static constexpr int kHi = 1;
  static bytes nibbles_hi(const uint8_t* p) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
  }
  static bytes halves8(int lo, int hi) {
    return _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(lo)), _mm_set1_epi8(static_cast<char>(hi)));
  }
  static acc unscale_hi(acc a) { return a; }
  // 8 words of two fp16 each: the low halves as float (returned) and the high ones (*m).
  static acc halves_to_float(const uint32_t* w, acc* m) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i lohi = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(v, 16));
    const __m256i ord = _mm256_permute4x64_epi64(lohi, _MM_SHUFFLE(3, 1, 2, 0));
    *m = _mm256_cvtph_ps(_mm256_extracti128_si256(ord, 1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(ord));
  }
  static acc mul_s(acc v, float s) { return _mm256_mul_ps(v, _mm256_set1_ps(s)); }
  static acc fma_s(acc v, float s, acc c) { return _mm256_fmadd_ps(v, _mm256_set1_ps(s), c); }
  static void store(float* f, acc v) { _mm256_storeu_ps(f, v); }
  static acc loadu(const float* f) { return _mm256_loadu_ps(f); }
  static float amax32(const float* x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
    for (int i = 8; i < 32; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 r = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
  }
  static int round32(const float* x, float id, int8_t* q) {
    const __m256 s = _mm256_set1_ps(id);
    __m256i i[4];
    for (int k = 0; k < 4; ++k)
      i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), s),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    // int32 to int8 with saturation; the packs interleave 128-bit halves, the permute undoes it.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h);
  }
};

}  // namespace

RowsFn rows_avx2() { return &rows_impl<V256>; }
AttnFn attn_avx2() { return &attn_task<V256>; }
QuantFns quant_avx2() { return {&qrows_impl<I256, V256>, &quantize_row<I256>}; }

}  // namespace wm::llm::gemv
#else
namespace wm::llm::gemv {
RowsFn rows_avx2() { return nullptr; }
AttnFn attn_avx2() { return nullptr; }
QuantFns quant_avx2() { return {}; }
}  // namespace wm::llm::gemv
#endif
