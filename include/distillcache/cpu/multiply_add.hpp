#pragma once
// The CPU backend's one rounding rule for a product added to a sum.
#include "../core/config.hpp"

#include <cmath>

namespace dc::cpu_detail {

// acc + a * b, rounded once where the CPU has FMA (std::fma is then one vfmadd) and twice where
// it has none. Spelled out because the compiler contracts a * b + c into an FMA only where it
// chooses to: two instantiations of one kernel (e.g. GEMM tiles of 1 x 2 and 1 x 4) then round
// differently, and a row of a batched GEMM would not equal the same row multiplied alone.
inline float multiply_add(float a, float b, float acc) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, acc);
#else
  return acc + a * b;
#endif
}

}  // namespace dc::cpu_detail
