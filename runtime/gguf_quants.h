#pragma once
// ggml's storage types as GGUF files hold them: values in blocks of a fixed count, each block a
// fixed number of bytes (fp16 scales and packed integers for the quantized types). Dequantization
// here equals, bit for bit, the `gguf` Python package's `gguf.quants.dequantize` (the committed
// fixtures in tests/runtime/fixtures/gguf_quants/ hold it to that): the same float32 operations,
// whose products are all exact, so the one rounding is the final addition of an offset.
//
// Types: F32, F16, BF16 (one value per "block"), Q8_0, Q4_0, Q4_1 (32 values per block), Q4_K,
// Q5_K, Q6_K (256 values per super-block). Any other type id throws wm::Error naming it
// (ggml_type_name).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/gguf.h"  // GgmlType, ggml_type_traits, ggml_type_name

namespace wm {

// Values per block and bytes per block of a supported type (ggml's type traits, which gguf.h
// holds, and gguf-py's GGML_QUANT_SIZES): Q4_K is {256, 144}, F16 is {1, 2}.
struct QuantBlock {
  int64_t values = 0;
  int64_t bytes = 0;
};

// True for the types this file dequantizes.
bool quant_supported(GgmlType type);

// The block geometry of a supported type. Throws wm::Error naming the type otherwise.
QuantBlock quant_block(GgmlType type);

// Bytes that n_values of a type occupy. Throws wm::Error on an unsupported type, a negative
// n_values or one that is not a multiple of the block's value count.
size_t quant_bytes(GgmlType type, int64_t n_values);

// Decodes n_values values (n_values / block values whole blocks, read from `blocks`, which needs
// no alignment) into out[0, n_values). Equal bit for bit to gguf.quants.dequantize; F32 and BF16
// keep NaN payloads, F16 keeps them too (quiet NaNs are what numpy keeps on every CPU). Throws
// wm::Error on an unsupported type or an n_values that quant_bytes refuses; writes nothing then.
void dequantize(GgmlType type, const void* blocks, int64_t n_values, float* out);

// A float32 CPU tensor of `shape` (outermost first, as torch writes it; GGUF's ne[] reversed)
// decoded from n_bytes bytes of blocks. The last dimension must be a multiple of the block's value
// count (blocks never straddle rows) and n_bytes must be exactly the tensor's size. Throws
// wm::Error naming the type, the shape and the sizes otherwise.
at::Tensor dequantize_tensor(GgmlType type, const void* blocks, size_t n_bytes, at::IntArrayRef shape);

// The dot product of n values stored as blocks of `type` with x[0, n), computed on the blocks
// as stored (each block's integer values dotted with x, then scaled: one multiply by the scales
// per block or sub-block, as quantized kernels do) for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K; the
// other supported types decode a block at a time into a buffer. Float32 sums in block order, so
// it differs from dequantize-then-dot by rounding only: within 1e-6 of sum |w_i x_i| on the
// tests' rows. Throws wm::Error as dequantize does.
float dot_row(GgmlType type, const void* blocks, const float* x, int64_t n);

}  // namespace wm
