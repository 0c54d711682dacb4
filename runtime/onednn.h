#pragma once
// bfloat16 products on a CPU's bfloat16 units (AVX-512 BF16, AMX) through oneDNN, with float32
// accumulation and a float32 or bfloat16 result. libtorch 1.x has bfloat16 x bfloat16 ->
// bfloat16 only, which rounds attention scores to 8 bits of mantissa; these keep them in
// float32, as flash attention does on a GPU. Built when Debian's libdnnl-dev (2.6 or later 2.x:
// the oneDNN that Debian's libtorch 1.13 itself links) is found; with libtorch 2.x (fused SDPA,
// a oneDNN of its own) it is left out. A libtorch 1.x from elsewhere that carries its own oneDNN
// is not a supported pairing with the system's.
#include <ATen/ATen.h>

namespace wm::onednn {

// True when this build has oneDNN and the CPU multiplies bfloat16 natively (else the callers
// compute in float32). Set WM_ONEDNN=0 in the environment to turn it off for a process.
bool native_bf16();

// c[i] = alpha * a[i] @ b[i]: a [n, M, K] and b [n, K, N] bfloat16 CPU tensors of any strides
// (a matrix with a unit stride in one of its two dimensions, a transposed or sliced view, is read
// in place; another is copied first), c [n, M, N] a contiguous float32 or bfloat16 CPU tensor,
// overwritten. Throws wm::Error on other shapes or dtypes, or when native_bf16() is false.
void bmm_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, float alpha = 1.f);

// p = softmax(s) along the last dimension, rounded to nearest: s float32 (overwritten with the
// float32 softmax), p bfloat16, both contiguous CPU tensors of one shape (rows of -inf give rows
// of NaN, as at::softmax). Throws as bmm_into.
void softmax_into(const at::Tensor& s, const at::Tensor& p);

}  // namespace wm::onednn
