#pragma once
// Linear layers whose weights stay as GGUF's quantized blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), on
// the CPU: y = x W^T + b for any number of rows of x, without a float copy of W.
//
// Two modes for the activations (process-wide, set_quant_activations):
//   Q8 (the default): x quantized once a product into llama.cpp's vec_dot_type for the weight
//     type (Q8_0 for Q4_0 and Q8_0, Q8_1 for Q4_1, Q8_K for Q4_K and Q6_K), then integer dot
//     products a block at a time, scaled per block in float32, in the arithmetic of ggml-cpu's
//     x86 kernels (quant_kernels.h): what llama.cpp computes on this CPU, the same bits on every
//     path and for every number of rows (a prompt's row equals the decode step's).
//   Float: x as given, the blocks' integers converted to float32 and dotted with it, scaled per
//     block or sub-block (runtime/gguf_quants' dot_row, summed in another order); for more than
//     gemv::kMaxRows rows, W is dequantized kFloatTileRows rows at a time and multiplied by
//     at::mm. What the conformance tests against transformers use.
//
// The kernels are the decode kernels' ISA paths (gemv.h's GemvPath: AVX-512 with VNNI, AVX2,
// plain C++; libtorch's path has no such product and takes auto's), on their thread team with
// at::get_num_threads() threads.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/gguf.h"

namespace wm::llm {

// A weight [out, in] kept as GGUF blocks: each row `in / block values` whole blocks, as a GGUF
// tensor of ggml dims {in, out} stores it.
struct QuantWeight {
  GgmlType type = GgmlType::F32;
  int64_t out = 0, in = 0;
  at::Tensor blocks;  // uint8 [out, row_bytes], CPU, contiguous; may wrap a mapped file

  bool defined() const { return blocks.defined(); }
  int64_t row_bytes() const;
  int64_t bytes() const;  // what a product reads: out * row_bytes
  // The weight as float32 [out, in] (then `dtype`), bit for bit runtime/gguf_quants' dequantize.
  at::Tensor dequantize(at::ScalarType dtype = at::kFloat) const;

  // Checks and wraps: `type` one quant_kernels_support takes, out >= 1, in a positive multiple
  // of the type's block, blocks uint8 [out, in / block values * block bytes] contiguous on the
  // CPU (rows may be any rows of a file's tensor: a permuted copy, say). Throws wm::Error naming
  // what is wrong.
  static QuantWeight from_blocks(GgmlType type, int64_t out, int64_t in, at::Tensor blocks);
  // The GGUF tensor `name` of two dims {in, out} (ggml order), its bytes wrapped where the file
  // maps them (no copy; the tensor holds `file` alive). Throws wm::Error as from_blocks does, and
  // naming the tensor and the file.
  static QuantWeight from_gguf(std::shared_ptr<const GgufFile> file, const std::string& name);
};

// True for the types the kernels take: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K.
bool quant_kernels_support(GgmlType type);

enum class QuantActivations { Q8, Float };
QuantActivations parse_quant_activations(const std::string& name);  // "q8", "float"; wm::Error otherwise
const char* quant_activations_name(QuantActivations a);
void set_quant_activations(QuantActivations a);  // process-wide
QuantActivations quant_activations();
// The kernels quantized products take under the current gemv path: "avx512" (AVX-512 with
// VNNI), "avx2" or "scalar".
const char* quant_active_name();

// y = x W^T + b: x [..., in] float32 (bfloat16 and float16 are taken in float32) on the CPU, any
// number of rows (none too); b [out] or undefined. Returns [..., out] in x's dtype, computed in
// float32. Throws wm::Error on an undefined weight, a mismatched x or bias, another device.
at::Tensor linear(const at::Tensor& x, const QuantWeight& w, const at::Tensor& bias);
// Several products of the same x: ys[i] = linear(x, ws[i], biases[i]), bit for bit, as one job of
// the decode team (one hand-over; x quantized once where the weights' activation types allow:
// Q8_0 and Q8_1 (Q4_0, Q4_1, Q8_0) together, Q8_K (Q4_K, Q6_K) together; else one by one).
// Throws as linear() does, and when the lists' lengths differ or are 0.
std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<QuantWeight>& ws,
                                    const std::vector<at::Tensor>& biases);

// Weight rows the float mode dequantizes at a time for more than kMaxRows rows of x.
inline constexpr int64_t kFloatTileRows = 256;

}  // namespace wm::llm
