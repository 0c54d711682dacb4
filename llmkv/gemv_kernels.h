#pragma once
// Decode-time matrix products on the CPU: y[m, o] = sum_i x[m, i] W[o, i] for a few rows of x
// (m <= kMaxRows), with W streamed once for all of them. At batch 1 a decoder's step is a chain
// of these, bound by how fast the weights stream from memory; the kernels read each weight once,
// convert it to float32 in registers and accumulate in float32.
//
// Weight kinds: float32, bfloat16, float16, and int8 in blocks of kInt8Block along the input
// dimension, each block with a float32 scale (w = q * scale, as llama.cpp's q8_0 with a float
// scale). The activations are float32 whatever the weights.
//
// Plain pointers and no libtorch here: the ISA files are compiled with their own -m flags
// (gemv_avx512.cpp, gemv_avx2.cpp) and must not share the precompiled ATen header. gemv.h is
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
  float* y = nullptr;             // [m, out] row-major float32
  int64_t m = 1, in = 0, out = 0;
};

// Computes the output rows [r0, r1) of p (every m). Each ISA's entry; null where the build or
// the CPU lacks it.
using RowsFn = void (*)(const Problem& p, int64_t r0, int64_t r1);
RowsFn rows_avx512();  // AVX-512 F/BW/VL (x86-64 builds; nullptr elsewhere)
RowsFn rows_avx2();    // AVX2 + FMA + F16C
RowsFn rows_scalar();  // any CPU

// All rows of p on up to `threads` threads (fewer for small outputs; one inside a parallel region
// or in a build without OpenMP, which run_rows_threaded() tells).
void run_rows(RowsFn fn, const Problem& p, int threads);
bool run_rows_threaded();


}  // namespace wm::llm::gemv
