#include "runtime/onednn.h"

#include <cstdlib>
#include <cstring>

#include "runtime/error.h"

#if defined(WM_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#if DNNL_VERSION_MAJOR != 2 || DNNL_VERSION_MINOR < 6
#undef WM_WITH_ONEDNN  // the calls below are oneDNN 2.6+'s (softmax_v2; 3.x moved the scales to run time)
#endif
#endif

namespace wm::onednn {

#if defined(WM_WITH_ONEDNN)
namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);  // thread-safe for primitive creation
  return eng;
}

dnnl::memory::data_type data_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return dnnl::memory::data_type::bf16;
    case at::kFloat: return dnnl::memory::data_type::f32;
    default: throw Error(str_cat("onednn: unsupported dtype ", t.scalar_type()));
  }
}

dnnl::memory::desc describe(const at::Tensor& t) {
  return dnnl::memory::desc(dnnl::memory::dims(t.sizes().begin(), t.sizes().end()), data_type(t),
                            dnnl::memory::dims(t.strides().begin(), t.strides().end()));
}

dnnl::memory bind(const dnnl::memory::desc& md, const at::Tensor& t) {
  return dnnl::memory(md, cpu_engine(), const_cast<void*>(t.data_ptr()));
}

void check_cpu(const at::Tensor& t, const char* name) {
  WM_CHECK(t.defined() && t.device().is_cpu(), name, " must be a CPU tensor");
}

// A matrix of [n, R, C] whose rows or columns are contiguous (what a matmul reads in place).
bool readable_matrix(const at::Tensor& t) {
  return t.dim() == 3 && (t.stride(2) == 1 || t.stride(1) == 1);
}

}  // namespace

bool native_bf16() {
  static const bool on = [] {
    const char* env = std::getenv("WM_ONEDNN");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & bf16) == bf16;  // the ISA values nest: AMX includes AVX-512 BF16
  }();
  return on;
}

void bmm_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, float alpha) {
  WM_CHECK(native_bf16(), "bfloat16 products need oneDNN and a CPU with bfloat16 units");
  check_cpu(a, "a");
  check_cpu(b, "b");
  check_cpu(c, "c");
  WM_CHECK(a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16, "a and b must be bfloat16, got ",
           a.scalar_type(), " and ", b.scalar_type());
  WM_CHECK(c.scalar_type() == at::kFloat || c.scalar_type() == at::kBFloat16, "c must be float32 or bfloat16, got ",
           c.scalar_type());
  WM_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3 && c.is_contiguous(),
           "a, b must be [n, M, K], [n, K, N], c [n, M, N] contiguous; got ", a.sizes(), ", ", b.sizes(), ", ",
           c.sizes(), " ", c.strides());
  if (!readable_matrix(a) || !readable_matrix(b)) {  // no unit stride: read a copy
    bmm_into(readable_matrix(a) ? a : a.contiguous(), readable_matrix(b) ? b : b.contiguous(), c, alpha);
    return;
  }
  WM_CHECK(a.size(0) == b.size(0) && a.size(0) == c.size(0) && a.size(2) == b.size(1) && a.size(1) == c.size(1) &&
               b.size(2) == c.size(2),
           "shapes do not fit: a ", a.sizes(), ", b ", b.sizes(), ", c ", c.sizes());
  if (c.numel() == 0) return;
  if (a.size(2) == 0) {
    c.zero_();
    return;
  }
  try {
    // One matrix at a time: oneDNN's AMX kernels take a batch only when it is dense, and a chunk
    // of attention reads a slice of its heads' rows and keys.
    const dnnl::memory::desc ma = describe(a[0]), mb = describe(b[0]), mc = describe(c[0]);
    dnnl::primitive_attr attr;
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    // Primitives come from oneDNN's own cache (by shape, strides and attributes) after the first.
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ma, mb, mc), attr, cpu_engine());
    const dnnl::matmul mm(pd);
    dnnl::stream strm(cpu_engine());
    for (int64_t i = 0; i < a.size(0); ++i)
      mm.execute(strm, {{DNNL_ARG_SRC, bind(ma, a[i])}, {DNNL_ARG_WEIGHTS, bind(mb, b[i])},
                        {DNNL_ARG_DST, bind(mc, c[i])}});
    strm.wait();
  } catch (const dnnl::error& e) {
    throw Error(str_cat("onednn: matmul ", a.sizes(), " x ", b.sizes(), " failed: ", e.what()));
  }
}

void softmax_into(const at::Tensor& s, const at::Tensor& p) {
  WM_CHECK(native_bf16(), "bfloat16 products need oneDNN and a CPU with bfloat16 units");
  check_cpu(s, "s");
  check_cpu(p, "p");
  WM_CHECK(s.scalar_type() == at::kFloat && p.scalar_type() == at::kBFloat16, "s must be float32 and p bfloat16, got ",
           s.scalar_type(), " and ", p.scalar_type());
  WM_CHECK(s.sizes() == p.sizes() && s.dim() >= 1 && s.is_contiguous() && p.is_contiguous(),
           "s and p must be contiguous and of one shape, got ", s.sizes(), " and ", p.sizes());
  if (s.numel() == 0) return;
  try {
    // In float32 in place, then rounded to nearest: oneDNN's softmax with a bfloat16 result
    // rounds twice (errors up to 2^-7 of a probability, against 2^-8 for one rounding).
    const dnnl::memory::desc ms = describe(s), mp = describe(p);
    const dnnl::softmax_v2_forward::primitive_desc pd(
        dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, ms, ms,
                                       static_cast<int>(s.dim()) - 1),
        cpu_engine());
    dnnl::stream strm(cpu_engine());
    dnnl::memory src = bind(ms, s), dst = bind(mp, p);
    dnnl::softmax_v2_forward(pd).execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, src}});
    dnnl::reorder(src, dst).execute(strm, src, dst);
    strm.wait();
  } catch (const dnnl::error& e) {
    throw Error(str_cat("onednn: softmax ", s.sizes(), " failed: ", e.what()));
  }
}

#else  // no oneDNN in this build

bool native_bf16() { return false; }

void bmm_into(const at::Tensor&, const at::Tensor&, const at::Tensor&, float) {
  throw Error("onednn: this build has no oneDNN (Debian's libdnnl-dev with libtorch 1.x)");
}

void softmax_into(const at::Tensor&, const at::Tensor&) {
  throw Error("onednn: this build has no oneDNN (Debian's libdnnl-dev with libtorch 1.x)");
}

#endif

}  // namespace wm::onednn
