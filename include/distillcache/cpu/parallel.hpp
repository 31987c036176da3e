#pragma once
// OpenMP helpers for the CPU backend. Without OpenMP the pragmas are ignored and these report
// one thread, so the CPU backend builds with any C++20 compiler.
#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dc::cpu_detail {

inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// The calling thread's number in its parallel region, and the region's thread count (0 and 1
// outside one).
inline int thread_num() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline int num_threads() {
#if defined(_OPENMP)
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// Which of `threads` threads takes an item covering rows [begin, end) of [0, total): the rows are
// cut into `threads` contiguous runs of equal length, and an item goes to the run holding its
// middle row. Passes over the same rows that share them out this way (the gather of an
// eviction's features, their check, the policy's scores) give each thread the rows it wrote in
// the pass before, still in its own core's cache: with the groups handed out in any order, H2O's
// scoring (the features' check) at B = 512 of 2048 took 89-92 us where it takes 52-56
// (bench/results/README.md, "Every pass of an eviction on the rows it wrote").
inline int contiguous_share(std::int64_t begin, std::int64_t end, std::int64_t total, int threads) {
  if (threads <= 1 || total <= 0) return 0;
  const std::int64_t share = (begin + end) * threads / (2 * total);  // (begin + end) / 2 is the middle row
  return int(std::clamp<std::int64_t>(share, 0, threads - 1));
}

}  // namespace dc::cpu_detail
