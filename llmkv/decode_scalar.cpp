// The decode kernels (decode_kernels.h) in plain C++ (one float a "register"): the path on CPUs
// without AVX2 and the reference the vector paths are tested against.
#include "llmkv/decode_kernels.h"
#include "llmkv/quant_kernels.h"

namespace wm::llm::gemv {
namespace {

#include "llmkv/decode_kernels.inl"

struct V1 {
  static constexpr bool kDotBf16 = false;
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
  static void sum8(const reg (&a)[8], float* out) {
    for (int k = 0; k < 8; ++k) out[k] = a[k];
  }
  template <WeightKind K>
  static reg w(const void* base, int64_t e) {
    return scalar_w<K>(base, e);
  }
};

#include "llmkv/quant_kernels.inl"

// The quantized-weight kernels' integer side, lane by lane: what the vector paths compute, to
// the bit (the float lanes' multiply-adds fused as theirs are).
struct I1 {
  struct bytes {
    uint8_t v[32];
  };
  struct lanes {
    int32_t v[8];
  };
  struct acc {
    float v[8];
  };
  static bytes load(const void* p) {
    bytes b;
    __builtin_memcpy(b.v, p, 32);
    return b;
  }
  static bytes nibbles(const uint8_t* p) {
    bytes b;
    for (int i = 0; i < 16; ++i) b.v[i] = p[i] & 0xF, b.v[i + 16] = p[i] >> 4;
    return b;
  }
  template <class F>
  static bytes map(bytes b, F f) {
    for (int i = 0; i < 32; ++i) b.v[i] = static_cast<uint8_t>(f(b.v[i]));
    return b;
  }
  static bytes lo4(bytes b) { return map(b, [](int v) { return v & 0xF; }); }
  static bytes hi4(bytes b) { return map(b, [](int v) { return v >> 4; }); }
  static bytes sub8(bytes b) { return map(b, [](int v) { return v - 8; }); }
  template <int S>
  static bytes or_hi2(bytes lo, bytes qh) {
    for (int i = 0; i < 32; ++i) lo.v[i] = static_cast<uint8_t>(lo.v[i] | (((qh.v[i] >> S) & 3) << 4));
    return lo;
  }
  static bytes splat8(int v) { return map(bytes{}, [v](int) { return v; }); }
  static bytes bsub(bytes a, bytes b) {
    for (int i = 0; i < 32; ++i) a.v[i] = static_cast<uint8_t>(a.v[i] - b.v[i]);
    return a;
  }
  static void store_bytes(void* p, bytes b) { __builtin_memcpy(p, b.v, 32); }
  static lanes dot_us(bytes u, bytes s) {
    lanes l;
    for (int j = 0; j < 8; ++j) {
      l.v[j] = 0;
      for (int k = 4 * j; k < 4 * j + 4; ++k) l.v[j] += int(u.v[k]) * int(static_cast<int8_t>(s.v[k]));
    }
    return l;
  }
  static lanes dot_ss(bytes a, bytes b) {
    lanes l;
    for (int j = 0; j < 8; ++j) {
      l.v[j] = 0;
      for (int k = 4 * j; k < 4 * j + 4; ++k) l.v[j] += int(static_cast<int8_t>(a.v[k])) * int(static_cast<int8_t>(b.v[k]));
    }
    return l;
  }
  template <class F>
  static lanes zip(lanes a, lanes b, F f) {
    for (int j = 0; j < 8; ++j) a.v[j] = f(a.v[j], b.v[j]);
    return a;
  }
  static lanes add(lanes a, lanes b) { return zip(a, b, [](int32_t x, int32_t y) { return x + y; }); }
  static lanes sub(lanes a, lanes b) { return zip(a, b, [](int32_t x, int32_t y) { return x - y; }); }
  static lanes mul(lanes a, lanes b) { return zip(a, b, [](int32_t x, int32_t y) { return x * y; }); }
  static lanes lanes_set1(int v) { return halves(v, v); }
  static lanes halves(int lo, int hi) { return lanes{{lo, lo, lo, lo, hi, hi, hi, hi}}; }
  static acc zero() { return acc{}; }
  static acc fma(float d, lanes l, acc a) {
    for (int j = 0; j < 8; ++j) a.v[j] = __builtin_fmaf(d, static_cast<float>(l.v[j]), a.v[j]);
    return a;
  }
  static float hsum(acc a) {
    const float* x = a.v;
    return ((x[4] + x[0]) + (x[6] + x[2])) + ((x[5] + x[1]) + (x[7] + x[3]));
  }
  static float h2f(uint16_t h) { return half_bits_to_float(h); }
  static constexpr int kHi = 16;  // as the AVX-512 path, which the AVX2 one (1) must equal
  static bytes nibbles_hi(const uint8_t* p) {
    bytes b;
    for (int i = 0; i < 16; ++i) b.v[i] = p[i] & 0xF, b.v[i + 16] = p[i] & 0xF0;
    return b;
  }
  static bytes halves8(int lo, int hi) {
    bytes b;
    for (int i = 0; i < 16; ++i) b.v[i] = static_cast<uint8_t>(lo), b.v[i + 16] = static_cast<uint8_t>(hi);
    return b;
  }
  static acc unscale_hi(acc a) {
    for (int j = 4; j < 8; ++j) a.v[j] *= 0.0625f;
    return a;
  }
  static acc halves_to_float(const uint32_t* w, acc* m) {
    acc d;
    for (int r = 0; r < 8; ++r) {
      d.v[r] = h2f(static_cast<uint16_t>(w[r] & 0xffff));
      m->v[r] = h2f(static_cast<uint16_t>(w[r] >> 16));
    }
    return d;
  }
  static acc mul_s(acc v, float s) {
    for (float& f : v.v) f *= s;
    return v;
  }
  static acc fma_s(acc v, float s, acc c) {
    for (int j = 0; j < 8; ++j) c.v[j] = __builtin_fmaf(v.v[j], s, c.v[j]);
    return c;
  }
  static void store(float* f, acc v) { __builtin_memcpy(f, v.v, sizeof v.v); }
  static acc loadu(const float* f) {
    acc a;
    __builtin_memcpy(a.v, f, sizeof a.v);
    return a;
  }
  static float amax32(const float* x) {
    float m = 0.f;
    for (int i = 0; i < 32; ++i) m = __builtin_fabsf(x[i]) > m ? __builtin_fabsf(x[i]) : m;
    return m;
  }
  static int round32(const float* x, float id, int8_t* q) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = x[i] * id;
      q[i] = saturate_i8(__builtin_rintf(v));
      sum += q[i];
    }
    return sum;
  }
};

}  // namespace

RowsFn rows_scalar() { return &rows_impl<V1>; }
AttnFn attn_scalar() { return &attn_task<V1>; }
QuantFns quant_scalar() { return {&qrows_impl<I1, V1>, &quantize_row<I1>}; }

}  // namespace wm::llm::gemv
