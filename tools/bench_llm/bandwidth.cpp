#include "tools/bench_llm/bandwidth.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/error.h"

namespace wm::bench {
namespace {

using Clock = std::chrono::steady_clock;

typedef float V4 __attribute__((vector_size(16)));

// body(lo, hi) on `threads` std::threads, each its share of [0, n) (libtorch's parallel_for
// runs serially in a file built without OpenMP, as this one is); returns the wall seconds.
template <class Body>
double timed(int64_t n, int threads, Body body) {
  const auto t0 = Clock::now();
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) team.emplace_back(body, n * t / threads, n * (t + 1) / threads);
  for (auto& th : team) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Bandwidth measure_bandwidth(int64_t array_bytes, int reps) {
  WM_CHECK(array_bytes >= static_cast<int64_t>(sizeof(float)), "the bandwidth arrays need at least 4 bytes, got ",
           array_bytes);
  WM_CHECK(reps >= 1, "the bandwidth needs at least one repetition, got ", reps);
  const int64_t n = array_bytes / static_cast<int64_t>(sizeof(float));
  const int threads = std::max(1, at::get_num_threads());
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
  timed(n, threads, [&](int64_t lo, int64_t hi) {  // first touch, by the threads that will read them
    for (int64_t i = lo; i < hi; ++i) pa[i] = 1.0f, pb[i] = 2.0f, pc[i] = 0.0f;
  });
  const float s = 3.0f;
  double copy_s = 1e30, triad_s = 1e30, read_s = 1e30;
  std::atomic<float> sink{0};  // keeps the sums alive
  for (int r = 0; r < reps; ++r) {
    // Four independent vector sums of 4 floats (the GCC/Clang vector extension; no reordering).
    read_s = std::min(read_s, timed(n, threads, [&](int64_t lo, int64_t hi) {
                        V4 acc[4] = {};
                        int64_t i = lo;
                        for (; i + 16 <= hi; i += 16)
                          for (int j = 0; j < 4; ++j) {
                            V4 x;
                            std::memcpy(&x, pa + i + 4 * j, sizeof x);
                            acc[j] += x;
                          }
                        float t = 0;
                        for (; i < hi; ++i) t += pa[i];
                        for (const V4& v : acc) t += v[0] + v[1] + v[2] + v[3];
                        sink.store(t, std::memory_order_relaxed);
                      }));
    copy_s = std::min(copy_s, timed(n, threads, [&](int64_t lo, int64_t hi) {
                        for (int64_t i = lo; i < hi; ++i) pc[i] = pa[i];
                      }));
    triad_s = std::min(triad_s, timed(n, threads, [&](int64_t lo, int64_t hi) {
                         for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
                       }));
  }
  const double bytes = static_cast<double>(n) * sizeof(float);
  Bandwidth bw;
  bw.copy_gbps = 2 * bytes / copy_s / 1e9;
  bw.triad_gbps = 3 * bytes / triad_s / 1e9;
  bw.read_gbps = bytes / read_s / 1e9;
  bw.array_bytes = n * static_cast<int64_t>(sizeof(float));
  bw.threads = threads;
  bw.reps = reps;
  return bw;
}

}  // namespace wm::bench
