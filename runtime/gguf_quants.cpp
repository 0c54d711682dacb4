// Dequantization of ggml's block types, written after gguf-py's numpy code (gguf/quants.py),
// operation for operation. Every product here is exact in float32: an fp16 scale has at most 11
// significant bits, a 6-bit scale or an int8 group scale at most 7 more, a quantized value at
// most 7 more (Q8_0) or 5 (the others), 23 bits at most and far from float32's range limits. So
// the one rounding of a value is its final addition (Q4_1's + m, the K-quants' - dmin * m), the
// same whatever the order of the products and whether or not a compiler fuses them into a
// multiply-add (checked: -O3 -march=native -ffp-contract=fast gives the same bits).
#include "runtime/gguf_quants.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/error.h"

namespace wm {
namespace gguf_quants_detail {

constexpr int64_t kQK = 32;    // values per block of Q8_0, Q4_0, Q4_1
constexpr int64_t kQK_K = 256;  // values per super-block of the K-quants
constexpr int64_t kKScaleSize = 12;  // packed 6-bit scales and mins of Q4_K and Q5_K

inline uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE half to float, exact (every half is a float); infinities and NaNs keep sign and payload.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  uint32_t e = 113;  // a subnormal half is a normal float: shift the leading one into place
  while (!(mant & 0x400u)) {
    mant <<= 1;
    --e;
  }
  return bits_to_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

inline float load_fp16(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

// Q4_K / Q5_K: scale and min of sub-block j (0..7) from the 12 packed bytes (ggml's
// get_scale_min_k4): bytes 0-3 hold the low 6 bits of scales 0-3 (top 2 bits: scales 4-7's high
// bits), bytes 4-7 the same for the mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibble)
// and mins 4-7 (high nibble).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Block layouts (little-endian fp16 `d`, `dmin`):
//   Q8_0 (34 bytes): d, int8 qs[32]; x = qs * d.
//   Q4_0 (18 bytes): d, qs[16]; value i < 16 is the low nibble of qs[i], value 16 + i the high
//                    nibble; x = d * (q - 8).
//   Q4_1 (20 bytes): d, m, qs[16] as Q4_0; x = d * q + m.
//   Q4_K (144 bytes): d, dmin, scales[12], qs[128]; 8 sub-blocks of 32: sub-block 2c reads the
//                    low nibbles of qs[32c, 32c + 32), 2c + 1 the high ones; x = (d * sc) * q -
//                    (dmin * m).
//   Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]; as Q4_K with bit s of qh[l] as the
//                    fifth bit of value l of sub-block s.
//   Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], d; value r of half h (128 values) takes
//                    its low 4 bits from ql[64h + r % 64] (nibble r / 64) and its high 2 from
//                    qh[32h + r % 32] (bits 2 (r / 32)); x = (d * scales[v / 16]) * (q - 32).

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < kQK; ++i) y[i] = float(qs[i]) * d;
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < kQK / 2; ++i) {
    y[i] = d * float(int(qs[i] & 0xF) - 8);
    y[i + kQK / 2] = d * float(int(qs[i] >> 4) - 8);
  }
}

void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float m = load_fp16(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < kQK / 2; ++i) {
    const float lo = d * float(qs[i] & 0xF);
    const float hi = d * float(qs[i] >> 4);
    y[i] = lo + m;
    y[i + kQK / 2] = hi + m;
  }
}

void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float dmin = load_fp16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 4 + kKScaleSize;
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const float ds = d * float(sc);
    const float dm = dmin * float(m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int l = 0; l < 32; ++l) {
      const float p = ds * float((q[l] >> shift) & 0xF);
      y[32 * s + l] = p - dm;
    }
  }
}

void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float dmin = load_fp16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 4 + kKScaleSize;
  const uint8_t* qs = qh + kQK_K / 8;
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const float ds = d * float(sc);
    const float dm = dmin * float(m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> s) & 1) << 4);
      const float p = ds * float(v);
      y[32 * s + l] = p - dm;
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + kQK_K / 2;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + kQK_K / 2 + kQK_K / 4);
  const float d = load_fp16(b + kQK_K / 2 + kQK_K / 4 + kQK_K / 16);
  float ds[16];
  for (int i = 0; i < 16; ++i) ds[i] = d * float(scales[i]);
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 128; ++r) {
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x3;
      const int v = 128 * h + r;
      y[v] = ds[v / 16] * float((lo | (hi << 4)) - 32);
    }
  }
}

void dequant_f32(const uint8_t* b, float* y) { std::memcpy(y, b, sizeof(float)); }
void dequant_f16(const uint8_t* b, float* y) { *y = load_fp16(b); }
void dequant_bf16(const uint8_t* b, float* y) { *y = bits_to_float(uint32_t(load_u16(b)) << 16); }

using BlockFn = void (*)(const uint8_t*, float*);

// The decoder of a type, or null when this file has none.
BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return &dequant_f32;
    case GgmlType::F16: return &dequant_f16;
    case GgmlType::BF16: return &dequant_bf16;
    case GgmlType::Q8_0: return &dequant_q8_0;
    case GgmlType::Q4_0: return &dequant_q4_0;
    case GgmlType::Q4_1: return &dequant_q4_1;
    case GgmlType::Q4_K: return &dequant_q4_k;
    case GgmlType::Q5_K: return &dequant_q5_k;
    case GgmlType::Q6_K: return &dequant_q6_k;
    default: return nullptr;
  }
}

struct Decoder {
  QuantBlock block;
  BlockFn fn;
};

// The geometry (ggml's, from gguf.h) and decoder of a supported type; throws naming it otherwise.
Decoder decoder(GgmlType type, const char* where) {
  const BlockFn fn = block_fn(type);
  const GgmlTypeTraits* traits = ggml_type_traits(type);
  if (!fn || !traits)
    throw Error(str_cat(where, ": ggml type ", ggml_type_name(type),
                        " is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K are)"));
  return Decoder{{int64_t(traits->block_size), int64_t(traits->block_bytes)}, fn};
}

// Dot products of one block with x (block values long), scales applied per block or sub-block.

float dot_q8_0(const uint8_t* b, const float* x) {
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  float s = 0.0f;
  for (int i = 0; i < kQK; ++i) s += float(qs[i]) * x[i];
  return load_fp16(b) * s;
}

float dot_q4_0(const uint8_t* b, const float* x) {
  const uint8_t* qs = b + 2;
  float s = 0.0f;
  for (int i = 0; i < kQK / 2; ++i)
    s += float(int(qs[i] & 0xF) - 8) * x[i] + float(int(qs[i] >> 4) - 8) * x[i + kQK / 2];
  return load_fp16(b) * s;
}

// d * sum q x + m * sum x.
float dot_q4_1(const uint8_t* b, const float* x) {
  const uint8_t* qs = b + 4;
  float s = 0.0f, sx = 0.0f;
  for (int i = 0; i < kQK / 2; ++i) {
    s += float(qs[i] & 0xF) * x[i] + float(qs[i] >> 4) * x[i + kQK / 2];
    sx += x[i] + x[i + kQK / 2];
  }
  return load_fp16(b) * s + load_fp16(b + 2) * sx;
}

// Per sub-block: (d sc) * sum q x - (dmin m) * sum x.
float dot_q4_k(const uint8_t* b, const float* x) {
  const float d = load_fp16(b);
  const float dmin = load_fp16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 4 + kKScaleSize;
  float acc = 0.0f;
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    const float* xs = x + 32 * s;
    float sq = 0.0f, sx = 0.0f;
    for (int l = 0; l < 32; ++l) {
      sq += float((q[l] >> shift) & 0xF) * xs[l];
      sx += xs[l];
    }
    acc += d * float(sc) * sq - dmin * float(m) * sx;
  }
  return acc;
}

// Per group of 16: (d scale) * sum (q - 32) x.
float dot_q6_k(const uint8_t* b, const float* x) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + kQK_K / 2;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + kQK_K / 2 + kQK_K / 4);
  const float d = load_fp16(b + kQK_K / 2 + kQK_K / 4 + kQK_K / 16);
  float acc = 0.0f;
  for (int g = 0; g < 16; ++g) {
    float sq = 0.0f;
    for (int v = 16 * g; v < 16 * g + 16; ++v) {
      const int h = v / 128, r = v % 128;
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x3;
      sq += float((lo | (hi << 4)) - 32) * x[v];
    }
    acc += d * float(scales[g]) * sq;
  }
  return acc;
}

using DotFn = float (*)(const uint8_t*, const float*);

// The block dot product of a type, or null where dot_row decodes instead.
DotFn dot_fn(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return &dot_q8_0;
    case GgmlType::Q4_0: return &dot_q4_0;
    case GgmlType::Q4_1: return &dot_q4_1;
    case GgmlType::Q4_K: return &dot_q4_k;
    case GgmlType::Q6_K: return &dot_q6_k;
    default: return nullptr;
  }
}

}  // namespace gguf_quants_detail

bool quant_supported(GgmlType type) {
  return gguf_quants_detail::block_fn(type) != nullptr && ggml_type_traits(type) != nullptr;
}

QuantBlock quant_block(GgmlType type) { return gguf_quants_detail::decoder(type, "quant_block").block; }

size_t quant_bytes(GgmlType type, int64_t n_values) {
  const QuantBlock b = gguf_quants_detail::decoder(type, "quant_bytes").block;
  WM_CHECK(n_values >= 0 && n_values % b.values == 0, ggml_type_name(type), " holds values in blocks of ",
           b.values, ", got a count of ", n_values);
  return size_t(n_values / b.values) * size_t(b.bytes);
}

void dequantize(GgmlType type, const void* blocks, int64_t n_values, float* out) {
  const gguf_quants_detail::Decoder dec = gguf_quants_detail::decoder(type, "dequantize");
  const QuantBlock b = dec.block;
  WM_CHECK(n_values >= 0 && n_values % b.values == 0, ggml_type_name(type), " holds values in blocks of ",
           b.values, ", got a count of ", n_values);
  const int64_t n_blocks = n_values / b.values;
  if (n_blocks == 0) return;
  const uint8_t* src = static_cast<const uint8_t*>(blocks);
  const gguf_quants_detail::BlockFn fn = dec.fn;
  // About 64 KiB of output per task: large tensors decode on every thread, small ones on one.
  const int64_t grain = std::max<int64_t>(1, 16384 / b.values);
  at::parallel_for(0, n_blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(src + i * b.bytes, out + i * b.values);
  });
}

at::Tensor dequantize_tensor(GgmlType type, const void* blocks, size_t n_bytes, at::IntArrayRef shape) {
  const QuantBlock b = gguf_quants_detail::decoder(type, "dequantize_tensor").block;
  int64_t n = 1;
  for (int64_t d : shape) {
    WM_CHECK(d >= 0, ggml_type_name(type), " tensor of shape ", shape, ": negative dimension");
    WM_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / d, ggml_type_name(type), " tensor of shape ", shape, ": too many values");
    n *= d;
  }
  const int64_t row = shape.empty() ? 1 : shape.back();
  WM_CHECK(row % b.values == 0, ggml_type_name(type), " tensor of shape ", shape, ": the last dimension (", row,
           ") is not a multiple of the block's ", b.values, " values");
  const size_t expected = quant_bytes(type, n);
  WM_CHECK(n_bytes == expected, ggml_type_name(type), " tensor of shape ", shape, ": expected ", expected,
           " bytes, got ", n_bytes);
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  dequantize(type, blocks, n, out.data_ptr<float>());
  return out;
}

float dot_row(GgmlType type, const void* blocks, const float* x, int64_t n) {
  const gguf_quants_detail::Decoder dec = gguf_quants_detail::decoder(type, "dot_row");
  const QuantBlock b = dec.block;
  WM_CHECK(n >= 0 && n % b.values == 0, ggml_type_name(type), " holds values in blocks of ", b.values,
           ", got a count of ", n);
  const uint8_t* src = static_cast<const uint8_t*>(blocks);
  const int64_t n_blocks = n / b.values;
  float acc = 0.0f;
  if (const gguf_quants_detail::DotFn fn = gguf_quants_detail::dot_fn(type)) {
    for (int64_t i = 0; i < n_blocks; ++i) acc += fn(src + i * b.bytes, x + i * b.values);
    return acc;
  }
  // Decoded in chunks of 256 values (whole blocks: every supported block size divides 256).
  constexpr int64_t kChunk = gguf_quants_detail::kQK_K;
  float buf[kChunk];
  const int64_t per_chunk = kChunk / b.values;
  for (int64_t i = 0; i < n_blocks; i += per_chunk) {
    const int64_t blocks_here = std::min(per_chunk, n_blocks - i);
    const int64_t m = blocks_here * b.values;
    for (int64_t j = 0; j < blocks_here; ++j) dec.fn(src + (i + j) * b.bytes, buf + j * b.values);
    const float* xs = x + i * b.values;
    for (int64_t j = 0; j < m; ++j) acc += buf[j] * xs[j];
  }
  return acc;
}

}  // namespace wm
