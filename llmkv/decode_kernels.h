#pragma once
// Decode-time matrix products on the CPU: y[m, o] = sum_i x[m, i] W[o, i] for a few rows of x
// (m <= kMaxRows), with W streamed once for all of them. At batch 1 a decoder's step is a chain
// of these, bound by how fast the weights stream from memory; the kernels read each weight once,
// convert it to float32 in registers and accumulate in float32.
//
// Weight kinds: float32, bfloat16, float16, and int8 in blocks of kInt8Block along the input
// dimension, each block with a float32 scale (w = q * scale, as llama.cpp's q8_0 with a float
// scale). The activations are float32 whatever the weights; bfloat16 weights may also be given
// x in bfloat16 (Problem::xb, the same values), which CPUs with AVX-512 BF16 multiply in pairs
// (vdpbf16ps: products exact, sums in float32).
//
// A thread's rows are read as R runs of consecutive rows side by side (R = 8 for one activation
// row): R streams, each front to back, which the hardware prefetches as streams; on the Zen 4
// machine these were measured on, that read bfloat16 weights 1.7x and float32 1.1-1.2x faster
// than R consecutive rows side by side (decode_kernels.inl, rows_m).
//
// Plain pointers and no libtorch here: the ISA files are compiled with their own -m flags
// (decode_avx512.cpp, decode_avx2.cpp) and must not share the precompiled ATen header. gemv.h is
// the libtorch-facing side (dispatch, threads, dtypes).
#include <cstdint>

namespace wm::llm::gemv {

enum class WeightKind : int { F32, BF16, F16, I8 };

inline constexpr int kMaxRows = 8;
inline constexpr int64_t kInt8Block = 32;

struct Problem {
  WeightKind kind = WeightKind::F32;
  const void* w = nullptr;        // [out, in] row-major, element type per kind
  const float* scales = nullptr;  // I8 only: [out, ceil(in / kInt8Block)]
  const float* x = nullptr;       // [m, in] row-major float32
  const float* xe = nullptr;      // BF16 with an even `in`, optional: x's even elements [m, in / 2]
  const float* xo = nullptr;      // ... and its odd ones (both or neither)
  const uint16_t* xb = nullptr;   // BF16, optional: x as bfloat16 bits [m, in], equal to x (kernels with a
                                  // bfloat16 dot take it; the others take x, or xe and xo)
  float* y = nullptr;             // [m, out] row-major float32
  int64_t m = 1, in = 0, out = 0;
};

// Attention of one query token per head over a window of keys (a decoder's step): per query head
// softmax(q.k * scale + logw) . v, with K/V stored float32, bfloat16 or float16 and everything
// computed in float32. K and V: per kv head, nk rows of d contiguous elements, heads
// head_stride elements apart (the window's [KH, capacity, d] buffers). The G = H / KH query
// heads of a kv head share its keys (GQA).
struct AttnProblem {
  WeightKind kind = WeightKind::F32;  // of K and V (F32, BF16 or F16)
  const float* q = nullptr;           // [H, d]
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t head_stride = 0;
  const float* logw = nullptr;  // [nk] (or [KH, nk]) added to the scores, or null
  int64_t logw_head_stride = 0;  // 0: one row for every kv head; nk: a row per kv head
  int64_t H = 0, KH = 0, nk = 0, d = 0;
  float scale = 1.f;
  float* out = nullptr;      // [H, d]
  float* mass = nullptr;     // [KH, nk]: the probabilities summed over each kv head's query heads, or null
  float* scratch = nullptr;  // [H, nk] (the scores)
};

// One task of an attention: kv head h, keys [j0, j1). For each of its G query heads g (query
// head h * G + g): scratch[head, j] = exp(score - m), m[g] the largest score in the range,
// l[g] = sum of those exponentials, o[g * d ..] = their sum of value rows (unnormalised).
using AttnFn = void (*)(const AttnProblem& p, int64_t h, int64_t j0, int64_t j1, float* m, float* l, float* o);
AttnFn attn_avx512();
AttnFn attn_avx2();
AttnFn attn_scalar();

// The whole attention of p: tasks over kv heads and key ranges on up to `threads` threads,
// merged by their maxima; then p.out (and p.mass).
void run_attention(AttnFn fn, const AttnProblem& p, int threads);
// Several attentions (independent problems: sequences decoded together) as one hand-over to the
// threads, their tasks spread over all of them; each problem's result as run_attention gives it.
void run_attention_many(AttnFn fn, const AttnProblem* ps, int64_t n, int threads);

// Computes the output rows [r0, r1) of p (every m). Each ISA's entry; null where the build or
// the CPU lacks it.
using RowsFn = void (*)(const Problem& p, int64_t r0, int64_t r1);
RowsFn rows_avx512();  // AVX-512 F/BW/VL (x86-64 builds; nullptr elsewhere)
RowsFn rows_avx512_bf16();  // the same with AVX-512 BF16's vdpbf16ps for bfloat16 weights given xb
RowsFn rows_avx2();    // AVX2 + FMA + F16C
RowsFn rows_scalar();  // any CPU

// All rows of p on up to `threads` threads (fewer for small outputs), the team of
// decode_threads.cpp.
void run_rows(RowsFn fn, const Problem& p, int threads);
// Several products (ps[0, n), any shapes) as one job of the team: one hand-over for all of them,
// their rows shared out as run_rows shares one product's.
void run_rows_many(RowsFn fn, const Problem* ps, int64_t n, int threads);


}  // namespace wm::llm::gemv
