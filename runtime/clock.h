#pragma once
// Process CPU time, for timings on a shared machine: wall time counts the time other processes
// hold the cores, the process's CPU time (all its threads together) does not.
#include <time.h>

namespace wm {

// Milliseconds of CPU time this process has used so far (every thread), from
// CLOCK_PROCESS_CPUTIME_ID; differences of two calls time a piece of work.
inline double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace wm
