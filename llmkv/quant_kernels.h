#pragma once
// Matrix products with weights kept as GGUF's quantized blocks (Q4_0, Q4_1, Q8_0: 32 values a
// block; Q4_K, Q6_K: 256 a super-block), read as stored: y[m, o] = sum_i x[m, i] W[o, i] for up
// to kMaxRows rows of x at a time, W streamed once for all of them. Two kinds of activations:
//
//  - 8-bit (what llama.cpp's CPU backend computes): x quantized once a product into llama.cpp's
//    vec_dot_type for the weight type (Q8_0 for Q4_0 and Q8_0, Q8_1 for Q4_1, Q8_K for Q4_K and
//    Q6_K), integer dot products per block, then per block in float32 the arithmetic of
//    ggml-cpu's x86 vec_dot kernels (AVX2 flavour): eight float32 lanes, lane j holding
//    elements 4j..4j+3 of each 32, each block's integer lane sums times its scale fused into
//    them (fma), the lanes summed at the end as hsum_float_8 does. Every path (AVX-512 VNNI,
//    AVX2, plain C++) gives the same bits: the integer sums are exact and the float operations
//    the same, in the same order.
//  - float32 (x as given, the blocks' integers converted to float32 and dotted with it, scaled
//    per block or sub-block: runtime/gguf_quants' dot_row with the sums in another order).
//
// Plain pointers and no libtorch here, as decode_kernels.h: the body (quant_kernels.inl) is
// compiled in each ISA file with its flags. quant_gemv.h is the libtorch-facing side.
#include <cstdint>

#include "llmkv/decode_kernels.h"

namespace wm::llm::gemv {

enum class QuantKind : int { Q4_0, Q4_1, Q8_0, Q4_K, Q6_K };

inline constexpr int64_t kQ32 = 32;    // values a block of Q4_0, Q4_1, Q8_0 (and of Q8_0/Q8_1)
inline constexpr int64_t kQK = 256;    // values a super-block of Q4_K, Q6_K (and of Q8_K)

// Values and bytes of a weight block of each kind (ggml's sizes).
inline constexpr int64_t quant_kind_values(QuantKind k) { return k == QuantKind::Q4_K || k == QuantKind::Q6_K ? kQK : kQ32; }
inline constexpr int64_t quant_kind_bytes(QuantKind k) {
  return k == QuantKind::Q4_0 ? 18 : k == QuantKind::Q4_1 ? 20 : k == QuantKind::Q8_0 ? 34 : k == QuantKind::Q4_K ? 144 : 210;
}
// Whether the activations of a kind are Q8_K (else Q8_0 or Q8_1).
inline constexpr bool quant_kind_is_k(QuantKind k) { return k == QuantKind::Q4_K || k == QuantKind::Q6_K; }

// Activations quantized for a weight kind, m rows of `in` values (in a multiple of the kind's
// block), each row's blocks as llama.cpp forms them, fields apart (the scales block-major, so
// that a block's scales for consecutive rows lie together):
//   Q8_0 / Q8_1 (per 32 values): d = fp16(amax / 127) (held as float32), q = round-half-even(x * 127
//     / amax) (0 where amax is 0); Q8_1 also s = fp16(float32(amax / 127) * sum q).
//   Q8_K (per 256): with mx the first value of largest magnitude, iscale = -127 / mx,
//     q = min(127, round-half-even(iscale * x)), d = 1 / iscale (float32), bsums = sums of 16 q.
struct QActs {
  int8_t* q = nullptr;       // [m, in]
  float* d = nullptr;        // [in / 32, ld] (Q8_0, Q8_1) or [in / 256, ld] (Q8_K): row r's block b at b * ld + r
  float* s = nullptr;        // [in / 32, ld], Q8_1 only
  int16_t* bsums = nullptr;  // [m, in / 16], Q8_K only
  int64_t ld = 1;            // rows of d and s (m, or more); d and s are read 8 floats at a time: 7 more must be readable
  // 0, or (m > kMaxRows) the floats between tiles of kMaxRows rows in d and s, each tile block-major
  // with ld = kMaxRows: row r's block b at (r / kMaxRows) * tile + b * ld + r % kMaxRows. A tile's
  // scales then lie together (block-major over all m rows, a tile read 8 floats kMaxRows * 4 bytes
  // apart: a 512-row prompt's were 2 KiB apart, a few cache sets thrashed, a third of a Q8_0
  // prompt product's time).
  int64_t tile = 0;
};

struct QProblem {
  QuantKind kind = QuantKind::Q4_1;
  const uint8_t* w = nullptr;  // [out] rows of row_bytes: in / values blocks each
  int64_t row_bytes = 0;
  bool float_x = false;        // the float32 mode (x, xsum) instead of the 8-bit one (a)
  QActs a;                     // 8-bit mode: quantize_fn's output for these m rows
  const float* x = nullptr;    // float mode: [m, in]
  const float* xsum = nullptr; // float mode, Q4_1 and Q4_K: [m, in / 32], sums of 32 x (their mins)
  float* y = nullptr;          // [m, out] row-major
  int64_t m = 1, in = 0, out = 0;
};

// Output rows [r0, r1) of p for m <= kMaxRows.
using QRowsFn = void (*)(const QProblem& p, int64_t r0, int64_t r1);
// Row `row` of x [.., in] quantized into a for a weight kind (the 8-bit mode's first step).
using QuantizeFn = void (*)(QuantKind kind, const float* x, int64_t in, const QActs& a, int64_t row);

struct QuantFns {
  QRowsFn rows = nullptr;
  QuantizeFn quantize = nullptr;
  bool defined() const { return rows != nullptr; }
};
QuantFns quant_avx512();  // AVX-512 F/BW/VL + VNNI (its integer dots are vpdpbusd); empty elsewhere
QuantFns quant_avx2();    // AVX2 + FMA + F16C (maddubs + madd)
QuantFns quant_scalar();  // any CPU

// The whole product for any m: rows of m at most kMaxRows at a time, the output rows split over
// up to `threads` threads of the decode team (each thread's weight rows read once per tile of
// kMaxRows activation rows, while they sit in its caches).
void run_qrows(QRowsFn fn, const QProblem& p, int threads);
// Several products with the same rows of activations (ps[i].m equal) as one job of the team.
void run_qrows_many(QRowsFn fn, const QProblem* ps, int64_t n, int threads);
// x [m, in] quantized into a, rows split over up to `threads` threads.
void run_quantize(QuantizeFn fn, QuantKind kind, const float* x, int64_t m, int64_t in, const QActs& a, int threads);

}  // namespace wm::llm::gemv
