#include "runtime/device.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ATen/Parallel.h>
#include <ATen/Context.h>

#include <thread>

#include "runtime/error.h"

namespace wm {

at::Device parse_device(const std::string& name) {
  if (name == "auto") return at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  at::Device d(at::kCPU);
  try {
    d = at::Device(name);
  } catch (const std::exception&) {
    throw Error(str_cat("unknown device '", name, "' (use auto, cpu, cuda or cuda:N)"));
  }
  if (d.is_cuda()) WM_CHECK(at::hasCUDA(), "device '", name, "' asked but this libtorch has no CUDA or no GPU is visible");
  return d;
}

at::ScalarType parse_compute_dtype(const std::string& s) {
  if (s == "float32" || s == "fp32") return at::kFloat;
  if (s == "float16" || s == "fp16") return at::kHalf;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  throw Error(str_cat("unknown dtype '", s, "' (float32, float16, bfloat16)"));
}

int init_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n);
  return at::get_num_threads();
}

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
#endif
}

std::string describe_device(at::Device d) {
  if (d.is_cpu()) return str_cat("cpu (", at::get_num_threads(), " threads)");
  return d.str();
}

}  // namespace wm
