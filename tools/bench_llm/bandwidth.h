// wm_bench_llm's memory bandwidth: a STREAM-like copy (c = a) and triad (a = b + s * c) over
// float32 arrays much larger than the caches, and a read (a's floats summed, as a GEMV's weights
// are only read), split over as many threads as libtorch's intra-op pool has (the threads the
// run uses). The bound a decode step's weight and K/V reads are put against. Bytes are counted
// as STREAM does (the stores' read-for-ownership not counted).
#pragma once

#include <cstdint>

namespace wm::bench {

struct Bandwidth {
  double copy_gbps = 0, triad_gbps = 0;  // best of `reps`, 1e9 bytes per second (reads + writes)
  double read_gbps = 0;                  // best of `reps`, reads only
  int64_t array_bytes = 0;               // bytes of each of the three arrays
  int threads = 0, reps = 0;
};

// Three arrays of `array_bytes` each (rounded down to whole floats; host memory), first touched
// by the threads that use them, then `reps` timed passes of each kernel (the best kept).
// Throws wm::Error when array_bytes < 4 or reps < 1; std::bad_alloc if the memory is not there.
Bandwidth measure_bandwidth(int64_t array_bytes, int reps);

}  // namespace wm::bench
