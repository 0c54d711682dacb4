#pragma once
// Choosing the compute device once, at a program's edge, and the CPU thread count.
#include <ATen/ATen.h>

#include <string>

namespace wm {

// "auto" (a GPU when libtorch has one, else the CPU), "cpu", "cuda", "cuda:N". Throws wm::Error
// for an unknown name or a GPU that is not there.
at::Device parse_device(const std::string& name);

// "float32" (or "fp32"), "float16" ("fp16"), "bfloat16" ("bf16"): the compute dtype a program's
// --dtype names. Throws wm::Error naming the accepted spellings otherwise.
at::ScalarType parse_compute_dtype(const std::string& name);

// Sets libtorch's intra-op threads to n, or to the machine's cores when n <= 0. Returns the count.
int init_threads(int n = 0);

// Keeps large freed blocks in the process (glibc): otherwise every step of a training or a
// rollout returns its activations to the kernel and faults them in again, which costs as much as
// the matmuls of a small model on the CPU. A no-op elsewhere.
void keep_freed_memory();

// "cpu (2 threads)" or "cuda:0 (NVIDIA H100 ...)"-like text for logs.
std::string describe_device(at::Device d);

}  // namespace wm
