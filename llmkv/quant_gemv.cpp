#include "llmkv/quant_gemv.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "llmkv/gemv.h"
#include "llmkv/quant_kernels.h"
#include "runtime/error.h"
#include "runtime/gguf_quants.h"

namespace wm::llm {
namespace quant_detail {

std::atomic<QuantActivations> g_acts{QuantActivations::Q8};

bool kind_of(GgmlType t, gemv::QuantKind* k) {
  switch (t) {
    case GgmlType::Q4_0: *k = gemv::QuantKind::Q4_0; return true;
    case GgmlType::Q4_1: *k = gemv::QuantKind::Q4_1; return true;
    case GgmlType::Q8_0: *k = gemv::QuantKind::Q8_0; return true;
    case GgmlType::Q4_K: *k = gemv::QuantKind::Q4_K; return true;
    case GgmlType::Q6_K: *k = gemv::QuantKind::Q6_K; return true;
    default: return false;
  }
}

gemv::QuantKind kind_of(GgmlType t) {
  gemv::QuantKind k;
  if (!kind_of(t, &k))
    throw Error(str_cat("quantized linear layers take Q4_0, Q4_1, Q8_0, Q4_K or Q6_K weights, got ", ggml_type_name(t)));
  return k;
}

// What the CPU has, for the ISA files' kernels.
struct Cpu {
  bool avx512 = false, avx2 = false;
  Cpu() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  }
};
const Cpu& cpu() {
  static const Cpu c;
  return c;
}

// The kernels for the current path, falling down to what this build and CPU have.
gemv::QuantFns fns(const char** name = nullptr) {
  auto pick = [&](gemv::QuantFns f, const char* n) {
    if (name) *name = n;
    return f;
  };
  const GemvPath p = gemv_path();
  const bool top = p == GemvPath::Auto || p == GemvPath::Avx512 || p == GemvPath::Libtorch;
  if (top && cpu().avx512 && gemv::quant_avx512().defined())
    return pick(gemv::quant_avx512(), "avx512");
  if (p != GemvPath::Scalar && cpu().avx2 && gemv::quant_avx2().defined())
    return pick(gemv::quant_avx2(), "avx2");
  return pick(gemv::quant_scalar(), "scalar");
}

// Per-thread buffers for a product's activations, kept between calls.
struct Buffers {
  std::vector<int8_t> q;
  std::vector<float> d, s, xsum;
  std::vector<int16_t> bsums;
  std::vector<float> tile;  // the float mode's dequantized weight rows
};
Buffers& buffers() {
  thread_local Buffers b;
  return b;
}

// x [m, in] quantized for w's kind into the buffers; returns their view.
gemv::QActs quantize(const gemv::QuantFns& f, gemv::QuantKind kind, const float* x, int64_t m, int64_t in) {
  Buffers& b = buffers();
  const bool k = gemv::quant_kind_is_k(kind);
  // d and s are read 8 rows at a time: 7 more floats past the last row. More rows than a tile
  // (kMaxRows) go in tiles, each tile's scales together (QActs::tile).
  const int64_t nb = in / (k ? gemv::kQK : gemv::kQ32);
  const bool tiled = m > gemv::kMaxRows;
  const int64_t tiles = (m + gemv::kMaxRows - 1) / gemv::kMaxRows;
  const auto scales = static_cast<size_t>((tiled ? tiles * gemv::kMaxRows : m) * nb + 7);
  b.q.resize(static_cast<size_t>(m * in));
  b.d.resize(scales);
  b.s.resize(kind == gemv::QuantKind::Q4_1 ? scales : 0);
  b.bsums.resize(k ? static_cast<size_t>(m * (in / 16)) : 0);
  gemv::QActs a;
  a.q = b.q.data();
  a.d = b.d.data();
  a.s = b.s.empty() ? nullptr : b.s.data();
  a.bsums = b.bsums.empty() ? nullptr : b.bsums.data();
  a.ld = tiled ? gemv::kMaxRows : m;
  a.tile = tiled ? gemv::kMaxRows * nb : 0;
  gemv::run_quantize(f.quantize, kind, x, m, in, a, at::get_num_threads());
  return a;
}

// y [m, out] = x [m, in] W^T in the float mode for many rows: W's rows dequantized
// kFloatTileRows at a time, each tile's product by at::mm.
void float_tiles(const QuantWeight& w, const at::Tensor& x2, at::Tensor& y2) {
  Buffers& b = buffers();
  const int64_t rb = w.row_bytes();
  const auto* base = w.blocks.data_ptr<uint8_t>();
  b.tile.resize(static_cast<size_t>(std::min(kFloatTileRows, w.out) * w.in));
  for (int64_t r0 = 0; r0 < w.out; r0 += kFloatTileRows) {
    const int64_t n = std::min(kFloatTileRows, w.out - r0);
    dequantize(w.type, base + r0 * rb, n * w.in, b.tile.data());
    const at::Tensor wt = at::from_blob(b.tile.data(), {n, w.in}, at::TensorOptions().dtype(at::kFloat));
    y2.narrow(1, r0, n).copy_(at::mm(x2, wt.t()));
  }
}

// The kernels' products of x [m, in] (float32, contiguous) by each of ws into ys[i] [m, out_i],
// as one job of the decode team: x quantized once (for the weights' activation type: Q8_1 where
// one of them is Q4_1, which serves Q4_0 and Q8_0 too; all Q8_K or none, the caller sees to it).
void kernel_products(const std::vector<const QuantWeight*>& ws, const float* x, int64_t m, const std::vector<float*>& ys) {
  const gemv::QuantFns f = fns();
  const int64_t in = ws[0]->in;
  gemv::QProblem base;
  base.m = m;
  base.in = in;
  if (quant_activations() == QuantActivations::Float) {
    Buffers& b = buffers();
    base.float_x = true;
    base.x = x;
    const int64_t n32 = in / gemv::kQ32;
    b.xsum.resize(static_cast<size_t>(m * n32));
    for (int64_t i = 0; i < m * n32; ++i) {
      float s = 0.f;
      for (int64_t j = 0; j < gemv::kQ32; ++j) s += x[i * gemv::kQ32 + j];
      b.xsum[i] = s;
    }
    base.xsum = b.xsum.data();
  } else {
    gemv::QuantKind acts = kind_of(ws[0]->type);
    for (const QuantWeight* w : ws)
      if (w->type == GgmlType::Q4_1) acts = gemv::QuantKind::Q4_1;
    base.a = quantize(f, acts, x, m, in);
  }
  std::vector<gemv::QProblem> ps(ws.size(), base);
  for (size_t i = 0; i < ws.size(); ++i) {
    ps[i].kind = kind_of(ws[i]->type);
    ps[i].w = ws[i]->blocks.data_ptr<uint8_t>();
    ps[i].row_bytes = ws[i]->row_bytes();
    ps[i].out = ws[i]->out;
    ps[i].y = ys[i];
  }
  gemv::run_qrows_many(f.rows, ps.data(), static_cast<int64_t>(ps.size()), at::get_num_threads());
}

}  // namespace quant_detail

int64_t QuantWeight::row_bytes() const {
  return defined() ? static_cast<int64_t>(quant_bytes(type, in)) : 0;
}

int64_t QuantWeight::bytes() const { return out * row_bytes(); }

at::Tensor QuantWeight::dequantize(at::ScalarType dtype) const {
  WM_CHECK(defined(), "dequantize of an empty quantized weight");
  at::Tensor w = dequantize_tensor(type, blocks.data_ptr(), static_cast<size_t>(bytes()), {out, in});
  return dtype == at::kFloat ? w : w.to(dtype);
}

bool quant_kernels_support(GgmlType type) {
  gemv::QuantKind k;
  return quant_detail::kind_of(type, &k);
}

QuantWeight QuantWeight::from_blocks(GgmlType type, int64_t out, int64_t in, at::Tensor blocks) {
  const gemv::QuantKind kind = quant_detail::kind_of(type);
  const int64_t values = gemv::quant_kind_values(kind), bb = gemv::quant_kind_bytes(kind);
  const std::string t = ggml_type_name(type);
  WM_CHECK(out >= 1 && in >= 1, t, " weight [out, in] = [", out, ", ", in, "]: both must be positive");
  WM_CHECK(in % values == 0, t, " rows are whole blocks of ", values, " values; in = ", in, " is not a multiple");
  const int64_t row = in / values * bb;
  WM_CHECK(out <= std::numeric_limits<int64_t>::max() / row, t, " weight [", out, ", ", in, "]: too many bytes");
  WM_CHECK(blocks.defined(), t, " weight [", out, ", ", in, "]: no blocks");
  WM_CHECK(blocks.device().is_cpu(), t, " blocks must be on the CPU, got ", blocks.device());
  WM_CHECK(blocks.scalar_type() == at::kByte, t, " blocks must be uint8, got ", blocks.scalar_type());
  WM_CHECK(blocks.dim() == 2 && blocks.size(0) == out && blocks.size(1) == row, t, " weight [", out, ", ", in,
           "] needs blocks [", out, ", ", row, "] (", in / values, " blocks of ", bb, " bytes a row), got ", blocks.sizes());
  WM_CHECK(blocks.is_contiguous(), t, " blocks must be contiguous");
  QuantWeight w;
  w.type = type;
  w.out = out;
  w.in = in;
  w.blocks = std::move(blocks);
  return w;
}

QuantWeight QuantWeight::from_gguf(std::shared_ptr<const GgufFile> file, const std::string& name) {
  WM_CHECK(file != nullptr, "no GGUF file for tensor '", name, "'");
  const GgufTensor& t = file->tensor(name);
  const std::string where = str_cat(file->path(), ": tensor '", name, "'");
  WM_CHECK(t.dims.size() == 2, where, " has ", t.dims.size(), " dimensions, a weight needs 2");
  WM_CHECK(quant_kernels_support(t.type), where, " is ", ggml_type_name(t.type),
           "; quantized linear layers take Q4_0, Q4_1, Q8_0, Q4_K or Q6_K");
  const int64_t in = t.dims[0], out = t.dims[1];
  const int64_t values = gemv::quant_kind_values(quant_detail::kind_of(t.type));
  WM_CHECK(in % values == 0 && out >= 1, where, ": dims {", in, ", ", out, "} are not whole rows of ", values, "-value blocks");
  const int64_t row = static_cast<int64_t>(quant_bytes(t.type, in));
  WM_CHECK(static_cast<int64_t>(t.nbytes) == out * row, where, ": ", t.nbytes, " bytes, expected ", out * row);
  at::Tensor blocks = at::from_blob(const_cast<uint8_t*>(t.data), {out, row}, [file](void*) {},
                                    at::TensorOptions().dtype(at::kByte));
  return from_blocks(t.type, out, in, std::move(blocks));
}

QuantActivations parse_quant_activations(const std::string& name) {
  if (name == "q8") return QuantActivations::Q8;
  if (name == "float") return QuantActivations::Float;
  throw Error(str_cat("unknown quantized-activation mode '", name, "' (q8, float)"));
}

const char* quant_activations_name(QuantActivations a) { return a == QuantActivations::Q8 ? "q8" : "float"; }
void set_quant_activations(QuantActivations a) { quant_detail::g_acts.store(a); }
QuantActivations quant_activations() { return quant_detail::g_acts.load(); }

const char* quant_active_name() {
  const char* name = "scalar";
  quant_detail::fns(&name);
  return name;
}

namespace {

void check_product(const at::Tensor& x, const QuantWeight& w, const at::Tensor& bias) {
  WM_CHECK(w.defined(), "quantized linear with an empty weight");
  WM_CHECK(x.dim() >= 1 && x.size(-1) == w.in, ggml_type_name(w.type), " weight [", w.out, ", ", w.in,
           "] needs x [..., ", w.in, "], got ", x.sizes());
  WM_CHECK(x.device().is_cpu(), "quantized weights run on the CPU, x is on ", x.device());
  WM_CHECK(at::isFloatingType(x.scalar_type()), "x must be floating point, got ", x.scalar_type());
  WM_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.out && bias.device().is_cpu()),
           "bias must be [", w.out, "] on the CPU, got ", bias.defined() ? bias.sizes() : at::IntArrayRef{});
}

// The products of x by ws (checked) plus their biases, in x's dtype.
std::vector<at::Tensor> products(const at::Tensor& x, const std::vector<const QuantWeight*>& ws,
                                 const std::vector<at::Tensor>& biases) {
  at::NoGradGuard no_grad;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t m = xf.numel() / x.size(-1);
  std::vector<at::Tensor> ys;
  std::vector<float*> yp;
  for (const QuantWeight* w : ws) {
    auto shape = x.sizes().vec();
    shape.back() = w->out;
    ys.push_back(at::empty(shape, xf.options()));
    yp.push_back(ys.back().data_ptr<float>());
  }
  if (m > 0) {
    if (quant_activations() == QuantActivations::Float && m > gemv::kMaxRows) {
      for (size_t i = 0; i < ws.size(); ++i) {
        at::Tensor y2 = ys[i].view({m, ws[i]->out});
        quant_detail::float_tiles(*ws[i], xf.view({m, ws[i]->in}), y2);
      }
    } else {
      quant_detail::kernel_products(ws, xf.data_ptr<float>(), m, yp);
    }
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    if (biases[i].defined()) ys[i].add_(biases[i].to(at::kFloat));
    if (x.scalar_type() != at::kFloat) ys[i] = ys[i].to(x.scalar_type());
  }
  return ys;
}

}  // namespace

at::Tensor linear(const at::Tensor& x, const QuantWeight& w, const at::Tensor& bias) {
  check_product(x, w, bias);
  return products(x, {&w}, {bias})[0];
}

std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<QuantWeight>& ws,
                                    const std::vector<at::Tensor>& biases) {
  WM_CHECK(ws.size() == biases.size() && !ws.empty(), "linear_many: ", ws.size(), " weights and ", biases.size(),
           " biases");
  std::vector<const QuantWeight*> group;
  for (size_t i = 0; i < ws.size(); ++i) {
    check_product(x, ws[i], biases[i]);
    // One quantization of x serves weights whose activations are all Q8_K or all Q8_0/Q8_1.
    if (gemv::quant_kind_is_k(quant_detail::kind_of(ws[i].type)) != gemv::quant_kind_is_k(quant_detail::kind_of(ws[0].type))) {
      std::vector<at::Tensor> ys;
      for (size_t j = 0; j < ws.size(); ++j) ys.push_back(linear(x, ws[j], biases[j]));
      return ys;
    }
    group.push_back(&ws[i]);
  }
  return products(x, group, biases);
}

}  // namespace wm::llm
