#pragma once
// OpenMP helpers for the CPU backend. Without OpenMP the pragmas are ignored and these report
// one thread, so the CPU backend builds with any C++20 compiler.
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

}  // namespace dc::cpu_detail
