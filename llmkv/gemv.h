#pragma once
// Decode-sized linear layers on the CPU: y = x W^T + b for up to gemv::kMaxRows rows of x, with
// the weights streamed once (decode_kernels.h), in float32, bfloat16, float16 or int8 with a
// float32 scale per block of 32 inputs; and int8 weight-only quantisation.
//
// At batch 1 a decoder step reads every weight once and does two flops with it, so its speed is
// the memory's: libtorch's general GEMM paths reach about half the machine's read bandwidth on
// such shapes (tools/README.md, wm_bench_llm --profile), these kernels approach it. The
// accumulation is float32 in every case; sums run in another order than libtorch's, so results
// agree with at::linear to float32 rounding, not bit for bit.
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace wm::llm {

// Which kernels decode-sized products take: the best the CPU has (auto), a given ISA (falls back
// to the next one down where the CPU lacks it), or libtorch's at::linear throughout (libtorch).
enum class GemvPath { Auto, Avx512, Avx2, Scalar, Libtorch };
GemvPath parse_gemv_path(const std::string& name);  // "auto", "avx512", "avx2", "scalar", "libtorch"
const char* gemv_path_name(GemvPath p);
void set_gemv_path(GemvPath p);  // process-wide; for benchmarks and tests
GemvPath gemv_path();
// The kernels in use after fallback: "avx512", "avx2", "scalar" or "libtorch".
const char* gemv_active_name();
// bfloat16 weights times bfloat16 x (a bfloat16 model's products) by AVX-512 BF16's vdpbf16ps
// where the CPU has it and the path is avx512 or auto (on by default; off: the same products
// by converting the weights to float32, as on CPUs without it). Process-wide; for benchmarks
// and tests. gemv_bf16_dot_active: whether the current path and CPU take it.
void set_gemv_bf16_dot(bool on);
bool gemv_bf16_dot();
bool gemv_bf16_dot_active();

// Int8 weights: w ~= q * scale, q in [-127, 127], one float32 scale per block of 32 consecutive
// inputs of a row (the last block may be shorter), chosen as the block's max |w| / 127.
struct Int8Weight {
  at::Tensor q;      // int8 [out, in]
  at::Tensor scale;  // float32 [out, ceil(in / 32)]
  bool defined() const { return q.defined(); }
  int64_t in() const { return q.size(1); }
  int64_t out() const { return q.size(0); }
  int64_t bytes() const;  // what a product reads: q and the scales
  // From a float32, bfloat16 or float16 weight [out, in] on the CPU.
  static Int8Weight quantize(const at::Tensor& w);
  at::Tensor dequantize(at::ScalarType dtype = at::kFloat) const;
};

// True when linear() below takes the kernels for x against w: the CPU, no autograd wanted,
// x [..., in] with at most kMaxRows rows, w [out, in] contiguous float32/bfloat16/float16, and a
// path other than libtorch.
bool gemv_applies(const at::Tensor& x, const at::Tensor& w);

// y = x W^T + b ([..., in] -> [..., out], x's dtype): the kernels where gemv_applies, else
// at::linear.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
// The same with int8 weights: the kernels for a few rows (whatever the path, libtorch having no
// such product), a dequantised copy of the weights and at::linear for more (prefill).
at::Tensor linear(const at::Tensor& x, const Int8Weight& w, const at::Tensor& bias);

// Several products of the same x ([..., in]): ys[i] = linear(x, ws[i], biases[i]) (biases[i]
// may be undefined), as one job of the decode kernels' threads (one hand-over, x converted once)
// where the kernels take every one (float weights: all of one dtype); else one by one. The same
// values as the separate calls. Throws wm::Error when the lists' lengths differ or are 0.
std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<at::Tensor>& ws,
                                    const std::vector<at::Tensor>& biases);
std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<Int8Weight>& ws,
                                    const std::vector<at::Tensor>& biases);

// One decoding step's attention on the CPU with the decode kernels: q [H, 1, d] (one query a
// head, any float dtype), k and v [KH, nk, d] float32/bfloat16/float16 with contiguous rows (as
// KvWindow::stage returns them: the heads may lie apart), logw [nk] or [KH, nk] (a row per kv head:
// per-head selection) float32, or undefined. What
// wm::attention computes for a query that sees every key (the causal mask's last row), in float32
// whatever the K/V dtype: {out [H, 1, d] in q's dtype, key mass [KH, nk] float32 (the
// probabilities summed over each kv head's query heads) when capture_mass, else undefined}.
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
std::pair<at::Tensor, at::Tensor> decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& logw, bool capture_mass);

// The batched decode step's attention (LlmModel::step_batch): one query token per sequence over
// its own float32 K/V rows, all sequences in one hand-over to the decode kernels' threads.
// Sequence i: q [H, d], k and v rows of kv head h at k + h * head_stride ([nk, d] each), logw
// [nk], out [H, d], scratch [H, nk].
struct DecodeSlot {
  const float* q;
  const void* k;
  const void* v;
  int64_t head_stride;
  const float* logw;
  int64_t nk;
  float* out;
  float* scratch;
};
// Whether the decode kernels run (not the libtorch path, --decode-kernels libtorch).
bool decode_kernels_on();
void decode_attention_slots(const std::vector<DecodeSlot>& slots, int64_t H, int64_t KH, int64_t d);

}  // namespace wm::llm
