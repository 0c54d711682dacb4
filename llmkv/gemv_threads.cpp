// The decode kernels' thread team: output rows split into one contiguous range a thread, so that
// each streams its own part of the weights. OpenMP, compiled with -fopenmp here alone (libtorch's
// at::parallel_for is a header template whose pragmas run serially in a file built without it);
// with the libgomp libtorch links (Debian's), this is libtorch's own pool.
#include "llmkv/gemv_kernels.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace wm::llm::gemv {

bool run_rows_threaded() {
#if defined(_OPENMP)
  return true;
#else
  return false;
#endif
}

void run_rows(RowsFn fn, const Problem& p, int threads) {
  // Fewer rows than this a thread cost more in the team's start than they save.
  constexpr int64_t kMinRowsPerThread = 64;
  const int64_t most = p.out / kMinRowsPerThread;
  if (most < threads) threads = static_cast<int>(most);
#if defined(_OPENMP)
  if (threads > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      const int64_t r0 = p.out * t / n, r1 = p.out * (t + 1) / n;
      if (r1 > r0) fn(p, r0, r1);
    }
    return;
  }
#endif
  (void)threads;
  fn(p, 0, p.out);
}

}  // namespace wm::llm::gemv
