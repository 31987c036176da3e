#pragma once
// The CPU backend's inner product, in kLanes independent partial sums.
//
// A single running sum is a serial chain of dependent FMAs that the compiler may not reorder
// without -ffast-math; kLanes sums are independent, so they become one vector FMA per kLanes
// elements. The order is fixed (lanes, then the tail), so results do not depend on threads.
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"
#include "../core/dtype.hpp"

namespace dc::cpu_detail {

inline constexpr int kLanes = 8;

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

// a . b, with b stored as float or bf16 (a KV cache's keys; widened as it is loaded).
template <class T>
inline float dot(const float* DC_RESTRICT a, const T* DC_RESTRICT b, int n) {
  float acc[kLanes] = {};
  const int n_vec = n / kLanes * kLanes;
  for (int i = 0; i < n_vec; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = multiply_add(a[i + l], element_as_float(b, i + l), acc[l]);
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (int i = n_vec; i < n; ++i) sum = multiply_add(a[i], element_as_float(b, i), sum);
  return sum;
}

}  // namespace dc::cpu_detail
