#include "llmkv/gemv.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "llmkv/decode_kernels.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

std::atomic<GemvPath> g_path{GemvPath::Auto};

bool cpu_has_avx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

bool cpu_has_avx512bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

std::atomic<bool> g_bf16_dot{true};

bool cpu_has_avx2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The kernels for a path, falling down to what this build and CPU have; nullptr for libtorch.
gemv::RowsFn rows_for(GemvPath p, const char** name = nullptr) {
  auto pick = [&](gemv::RowsFn f, const char* n) {
    if (name) *name = n;
    return f;
  };
  if (p == GemvPath::Libtorch) return pick(nullptr, "libtorch");
  if ((p == GemvPath::Auto || p == GemvPath::Avx512) && cpu_has_avx512() && gemv::rows_avx512()) {
    static const bool bf16 = cpu_has_avx512bf16() && gemv::rows_avx512_bf16();
    return pick(bf16 && g_bf16_dot.load() ? gemv::rows_avx512_bf16() : gemv::rows_avx512(), "avx512");
  }
  if (p != GemvPath::Scalar && cpu_has_avx2() && gemv::rows_avx2()) return pick(gemv::rows_avx2(), "avx2");
  return pick(gemv::rows_scalar(), "scalar");
}

gemv::AttnFn attn_for(GemvPath p) {
  if ((p == GemvPath::Auto || p == GemvPath::Avx512) && cpu_has_avx512() && gemv::attn_avx512())
    return gemv::attn_avx512();
  if (p != GemvPath::Scalar && cpu_has_avx2() && gemv::attn_avx2()) return gemv::attn_avx2();
  return gemv::attn_scalar();
}

gemv::WeightKind kind_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return gemv::WeightKind::F32;
    case at::kBFloat16: return gemv::WeightKind::BF16;
    case at::kHalf: return gemv::WeightKind::F16;
    case at::kChar: return gemv::WeightKind::I8;
    default: throw Error(str_cat("the decode kernels take float32, bfloat16, float16 or int8 weights, got ", t));
  }
}

int64_t rows_of(const at::Tensor& x) { return x.size(-1) > 0 ? x.numel() / x.size(-1) : 0; }

// Element i of a contiguous float32, bfloat16 or float16 array as float32.
inline float element(const void* base, at::ScalarType t, int64_t i) {
  switch (t) {
    case at::kBFloat16: return static_cast<float>(static_cast<const c10::BFloat16*>(base)[i]);
    case at::kHalf: return static_cast<float>(static_cast<const c10::Half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// The float32 buffers a product needs (x, its even/odd split, y), kept per thread between calls:
// a decode step makes some two hundred products, and no tensor is made for any of them but the
// result.
struct Scratch {
  std::vector<float> x, xe, xo, y;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// One weight of a product: its kind, elements, int8 scales (or null), rows, bias (or undefined).
struct Weight {
  gemv::WeightKind kind;
  const void* w;
  const float* scales;
  int64_t out;
  const at::Tensor* bias;
};

// x's float32 rows (and its even/odd split for bfloat16 weights, or its bfloat16 bits for the
// kernels with a bfloat16 dot) in p, from x's contiguous copy xc.
void prepare_x(gemv::RowsFn fn, const at::Tensor& xc, gemv::WeightKind kind, Scratch& s, gemv::Problem& p) {
  const int64_t in = p.in, m = p.m;
  const at::ScalarType xt = xc.scalar_type();
  if (xt == at::kFloat) {
    p.x = xc.data_ptr<float>();
  } else {
    s.x.resize(static_cast<size_t>(m * in));
    const void* src = xc.data_ptr();
    for (int64_t i = 0; i < m * in; ++i) s.x[i] = element(src, xt, i);
    p.x = s.x.data();
  }
  // bfloat16 weights and x: the kernels with a bfloat16 dot multiply them as they are.
  if (kind == gemv::WeightKind::BF16 && xt == at::kBFloat16) p.xb = static_cast<const uint16_t*>(xc.data_ptr());
  if (kind == gemv::WeightKind::BF16 && in % 2 == 0 && !(p.xb && fn == gemv::rows_avx512_bf16())) {
    // x split into even and odd elements
    s.xe.resize(static_cast<size_t>(m * in / 2));
    s.xo.resize(static_cast<size_t>(m * in / 2));
    for (int64_t i = 0; i < m * in / 2; ++i) {
      s.xe[i] = p.x[2 * i];
      s.xo[i] = p.x[2 * i + 1];
    }
    p.xe = s.xe.data();
    p.xo = s.xo.data();
  }
}

// The bias in float32 on p.y's rows, then the rounding to y's dtype where it is not float32 (as
// at::linear rounds once, at the end).
void finish_y(const gemv::Problem& p, const at::Tensor& bias, at::Tensor& y) {
  const at::ScalarType yt = y.scalar_type();
  const at::Tensor bc = bias.defined() ? bias.contiguous() : bias;
  const void* bp = bias.defined() ? bc.data_ptr() : nullptr;
  const at::ScalarType bt = bias.defined() ? bias.scalar_type() : at::kFloat;
  const int64_t out = p.out;
  for (int64_t r = 0; r < p.m; ++r) {
    float* yr = p.y + r * out;
    if (bp)
      for (int64_t o = 0; o < out; ++o) yr[o] += element(bp, bt, o);
    if (yt == at::kBFloat16) {
      auto* dst = static_cast<c10::BFloat16*>(y.data_ptr()) + r * out;
      for (int64_t o = 0; o < out; ++o) dst[o] = c10::BFloat16(yr[o]);
    } else if (yt == at::kHalf) {
      auto* dst = static_cast<c10::Half*>(y.data_ptr()) + r * out;
      for (int64_t o = 0; o < out; ++o) dst[o] = c10::Half(yr[o]);
    }
  }
}

// x [..., in] (m rows) times each weight's W^T, plus its bias, into new tensors [..., out] of x's
// dtype: the products as one job of the decode team (weights of one kind).
std::vector<at::Tensor> run(gemv::RowsFn fn, const at::Tensor& x, const std::vector<Weight>& ws) {
  const int64_t in = x.size(-1), m = rows_of(x), n = static_cast<int64_t>(ws.size());
  const at::ScalarType xt = x.scalar_type();
  Scratch& s = scratch();
  gemv::Problem base;
  base.kind = ws[0].kind;
  base.m = m;
  base.in = in;
  const at::Tensor xc = x.contiguous();
  prepare_x(fn, xc, base.kind, s, base);
  std::vector<gemv::Problem> ps(ws.size(), base);
  std::vector<at::Tensor> ys;
  int64_t floats = 0;
  for (const Weight& w : ws) floats += m * w.out;
  s.y.resize(static_cast<size_t>(xt == at::kFloat ? 0 : floats));
  for (int64_t i = 0, off = 0; i < n; ++i) {
    auto shape = x.sizes().vec();
    shape.back() = ws[i].out;
    ys.push_back(at::empty(shape, x.options().memory_format(at::MemoryFormat::Contiguous)));
    ps[i].w = ws[i].w;
    ps[i].scales = ws[i].scales;
    ps[i].out = ws[i].out;
    ps[i].y = xt == at::kFloat ? ys[i].data_ptr<float>() : s.y.data() + off;
    off += m * ws[i].out;
  }
  gemv::run_rows_many(fn, ps.data(), n, at::get_num_threads());
  for (int64_t i = 0; i < n; ++i) finish_y(ps[i], ws[i].bias ? *ws[i].bias : at::Tensor(), ys[i]);
  return ys;
}

at::Tensor run(gemv::RowsFn fn, const at::Tensor& x, gemv::WeightKind kind, const void* w, const float* scales,
               int64_t out, const at::Tensor& bias) {
  return run(fn, x, {Weight{kind, w, scales, out, &bias}})[0];
}

}  // namespace

GemvPath parse_gemv_path(const std::string& name) {
  if (name == "auto") return GemvPath::Auto;
  if (name == "avx512") return GemvPath::Avx512;
  if (name == "avx2") return GemvPath::Avx2;
  if (name == "scalar") return GemvPath::Scalar;
  if (name == "libtorch") return GemvPath::Libtorch;
  throw Error(str_cat("unknown decode kernel path '", name, "' (auto, avx512, avx2, scalar, libtorch)"));
}

const char* gemv_path_name(GemvPath p) {
  switch (p) {
    case GemvPath::Auto: return "auto";
    case GemvPath::Avx512: return "avx512";
    case GemvPath::Avx2: return "avx2";
    case GemvPath::Scalar: return "scalar";
    case GemvPath::Libtorch: return "libtorch";
  }
  return "?";
}

void set_gemv_path(GemvPath p) { g_path.store(p); }
void set_gemv_bf16_dot(bool on) { g_bf16_dot.store(on); }
bool gemv_bf16_dot() { return g_bf16_dot.load(); }
bool gemv_bf16_dot_active() { return rows_for(gemv_path()) == gemv::rows_avx512_bf16() && gemv::rows_avx512_bf16(); }
GemvPath gemv_path() { return g_path.load(); }

const char* gemv_active_name() {
  const char* name = "libtorch";
  rows_for(gemv_path(), &name);
  return name;
}

int64_t Int8Weight::bytes() const {
  return defined() ? q.numel() + scale.numel() * static_cast<int64_t>(sizeof(float)) : 0;
}

Int8Weight Int8Weight::quantize(const at::Tensor& w) {
  WM_CHECK(w.dim() == 2, "int8 quantisation takes a weight [out, in], got ", w.sizes());
  WM_CHECK(w.device().is_cpu(), "int8 quantisation runs on the CPU, the weight is on ", w.device());
  WM_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf,
           "int8 quantisation takes float32, bfloat16 or float16 weights, got ", w.scalar_type());
  at::NoGradGuard no_grad;
  const int64_t out = w.size(0), in = w.size(1), blk = gemv::kInt8Block;
  const int64_t nb = (in + blk - 1) / blk;
  at::Tensor wf = w.to(at::kFloat);
  if (nb * blk != in) wf = at::constant_pad_nd(wf, {0, nb * blk - in}, 0.0);
  at::Tensor blocks = wf.reshape({out, nb, blk});
  at::Tensor amax = blocks.abs().amax(-1);  // [out, nb]
  at::Tensor scale = amax / 127.0;
  at::Tensor inv = at::where(scale > 0, 1.0 / scale, at::zeros_like(scale));
  at::Tensor q = at::round(blocks * inv.unsqueeze(-1)).clamp_(-127, 127).to(at::kChar).reshape({out, nb * blk});
  Int8Weight r;
  r.q = q.narrow(1, 0, in).contiguous();
  r.scale = scale.contiguous();
  return r;
}

at::Tensor Int8Weight::dequantize(at::ScalarType dtype) const {
  WM_CHECK(defined(), "dequantize of an empty int8 weight");
  at::Tensor s = scale.repeat_interleave(gemv::kInt8Block, 1).narrow(1, 0, in());  // [out, in]
  return (q.to(at::kFloat) * s).to(dtype);
}

bool gemv_applies(const at::Tensor& x, const at::Tensor& w) {
  if (gemv_path() == GemvPath::Libtorch) return false;
  if (!x.device().is_cpu() || !w.device().is_cpu() || w.dim() != 2 || !w.is_contiguous()) return false;
  if (x.dim() < 1 || x.size(-1) != w.size(1) || w.numel() == 0) return false;
  const int64_t m = rows_of(x);
  if (m < 1 || m > gemv::kMaxRows) return false;
  const auto wt = w.scalar_type(), xt = x.scalar_type();
  if (wt != at::kFloat && wt != at::kBFloat16 && wt != at::kHalf) return false;
  if (xt != at::kFloat && xt != at::kBFloat16 && xt != at::kHalf) return false;
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) return false;
  return true;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!gemv_applies(x, w)) return at::linear(x, w, bias);
  return run(rows_for(gemv_path()), x, kind_of(w.scalar_type()), w.data_ptr(), nullptr, w.size(0), bias);
}

at::Tensor linear(const at::Tensor& x, const Int8Weight& w, const at::Tensor& bias) {
  WM_CHECK(w.defined(), "int8 linear with an empty weight");
  WM_CHECK(x.dim() >= 1 && x.size(-1) == w.in(), "x must be [..., ", w.in(), "], got ", x.sizes());
  WM_CHECK(x.device().is_cpu(), "int8 weights run on the CPU, x is on ", x.device());
  const int64_t m = rows_of(x), out = w.out();
  if (m > gemv::kMaxRows || m == 0) return at::linear(x, w.dequantize(x.scalar_type()), bias);
  gemv::RowsFn fn = rows_for(gemv_path() == GemvPath::Libtorch ? GemvPath::Auto : gemv_path());
  return run(fn, x, gemv::WeightKind::I8, w.q.data_ptr(), w.scale.data_ptr<float>(), out, bias);
}

std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<at::Tensor>& ws,
                                    const std::vector<at::Tensor>& biases) {
  WM_CHECK(ws.size() == biases.size() && !ws.empty(), "linear_many: ", ws.size(), " weights and ", biases.size(),
           " biases");
  bool together = true;
  for (const at::Tensor& w : ws) together = together && gemv_applies(x, w) && w.scalar_type() == ws[0].scalar_type();
  std::vector<at::Tensor> ys;
  if (!together) {
    for (size_t i = 0; i < ws.size(); ++i) ys.push_back(linear(x, ws[i], biases[i]));
    return ys;
  }
  std::vector<Weight> group;
  for (size_t i = 0; i < ws.size(); ++i)
    group.push_back({kind_of(ws[i].scalar_type()), ws[i].data_ptr(), nullptr, ws[i].size(0), &biases[i]});
  return run(rows_for(gemv_path()), x, group);
}

std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<Int8Weight>& ws,
                                    const std::vector<at::Tensor>& biases) {
  WM_CHECK(ws.size() == biases.size() && !ws.empty(), "linear_many: ", ws.size(), " weights and ", biases.size(),
           " biases");
  const int64_t m = rows_of(x);
  bool together = m >= 1 && m <= gemv::kMaxRows && x.device().is_cpu();
  for (const Int8Weight& w : ws) together = together && w.defined() && x.dim() >= 1 && x.size(-1) == w.in();
  std::vector<at::Tensor> ys;
  if (!together) {
    for (size_t i = 0; i < ws.size(); ++i) ys.push_back(linear(x, ws[i], biases[i]));
    return ys;
  }
  std::vector<Weight> group;
  for (size_t i = 0; i < ws.size(); ++i)
    group.push_back({gemv::WeightKind::I8, ws[i].q.data_ptr(), ws[i].scale.data_ptr<float>(), ws[i].out(), &biases[i]});
  return run(rows_for(gemv_path() == GemvPath::Libtorch ? GemvPath::Auto : gemv_path()), x, group);
}

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (gemv_path() == GemvPath::Libtorch) return false;
  if (!q.device().is_cpu() || !k.device().is_cpu() || !v.device().is_cpu()) return false;
  if (q.dim() != 3 || k.dim() != 3 || v.sizes() != k.sizes() || q.size(1) != 1) return false;
  const int64_t H = q.size(0), KH = k.size(0), nk = k.size(1), d = k.size(2);
  if (KH == 0 || H % KH != 0 || q.size(2) != d || nk == 0 || d == 0) return false;
  if (k.scalar_type() != v.scalar_type() || k.strides() != v.strides()) return false;
  const auto t = k.scalar_type();
  if (t != at::kFloat && t != at::kBFloat16 && t != at::kHalf) return false;
  if (k.stride(2) != 1 || k.stride(1) != d) return false;
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return false;
  return true;
}

std::pair<at::Tensor, at::Tensor> decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& logw, bool capture_mass) {
  WM_CHECK(decode_attention_applies(q, k, v), "decode attention takes q [H, 1, d] and k/v [KH, nk, d] on the CPU "
           "with contiguous rows; got q ", q.sizes(), ", k ", k.sizes(), " strides ", k.strides(), ", v ", v.sizes());
  const int64_t H = q.size(0), KH = k.size(0), nk = k.size(1), d = k.size(2);
  WM_CHECK(!logw.defined() || (logw.dim() == 1 && logw.size(0) == nk) ||
               (logw.dim() == 2 && logw.size(0) == KH && logw.size(1) == nk),
           "logw must be [", nk, "] or [", KH, ", ", nk, "], got ", logw.sizes());
  at::Tensor qf = q.reshape({H, d}).to(at::kFloat).contiguous();
  at::Tensor lw = logw.defined() ? logw.to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor out = at::empty({H, d}, qf.options());
  at::Tensor scratch = at::empty({H, nk}, qf.options());
  at::Tensor mass = capture_mass ? at::empty({KH, nk}, qf.options()) : at::Tensor();
  gemv::AttnProblem p;
  p.kind = kind_of(k.scalar_type());
  p.q = qf.data_ptr<float>();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.head_stride = k.stride(0);
  p.logw = lw.defined() ? lw.data_ptr<float>() : nullptr;
  p.logw_head_stride = lw.defined() && lw.dim() == 2 ? nk : 0;
  p.H = H;
  p.KH = KH;
  p.nk = nk;
  p.d = d;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  p.out = out.data_ptr<float>();
  p.mass = capture_mass ? mass.data_ptr<float>() : nullptr;
  p.scratch = scratch.data_ptr<float>();
  gemv::run_attention(attn_for(gemv_path()), p, at::get_num_threads());
  return {out.to(q.scalar_type()).view({H, 1, d}), mass};
}

bool decode_kernels_on() { return gemv_path() != GemvPath::Libtorch; }

void decode_attention_slots(const std::vector<DecodeSlot>& slots, int64_t H, int64_t KH, int64_t d) {
  std::vector<gemv::AttnProblem> ps(slots.size());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (size_t i = 0; i < slots.size(); ++i) {
    gemv::AttnProblem& p = ps[i];
    p.kind = gemv::WeightKind::F32;
    p.q = slots[i].q;
    p.k = slots[i].k;
    p.v = slots[i].v;
    p.head_stride = slots[i].head_stride;
    p.logw = slots[i].logw;
    p.H = H;
    p.KH = KH;
    p.nk = slots[i].nk;
    p.d = d;
    p.scale = scale;
    p.out = slots[i].out;
    p.scratch = slots[i].scratch;
  }
  gemv::run_attention_many(attn_for(gemv_path()), ps.data(), static_cast<int64_t>(ps.size()), at::get_num_threads());
}

}  // namespace wm::llm
