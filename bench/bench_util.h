// Shared by the C++ benchmarks: the clock. (Flags: base/cli.h.)
#pragma once

#include <time.h>

#include <chrono>

namespace winnow::bench {

// Seconds on the chosen clock: wall (steady) or this thread's CPU time.
inline double Now(bool cpu_time) {
  if (cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace winnow::bench
