#pragma once
// Runs a function with a given OpenMP thread count and restores the previous one: the
// thread-count-independence tests compare its results for 1, 2 and 3 threads. Without OpenMP
// it just runs the function.
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dc_test {

template <class Fn>
auto with_threads(int threads, Fn&& fn) {
#if defined(_OPENMP)
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = fn();
  omp_set_num_threads(saved);
  return result;
#else
  (void)threads;
  return fn();
#endif
}

}  // namespace dc_test
