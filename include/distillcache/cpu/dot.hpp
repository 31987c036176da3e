#pragma once
// The CPU backend's inner product, in kLanes independent partial sums.
//
// A single running sum is a serial chain of dependent FMAs that the compiler may not reorder
// without -ffast-math; kLanes sums are independent, so they become one vector FMA per kLanes
// elements. The order is fixed (lanes, then the tail), so results do not depend on threads.
#include <cstdint>

#include "../core/config.hpp"

namespace dc::cpu_detail {

inline constexpr int kLanes = 8;

inline float dot(const float* DC_RESTRICT a, const float* DC_RESTRICT b, int n) {
  float acc[kLanes] = {};
  const int n_vec = n / kLanes * kLanes;
  for (int i = 0; i < n_vec; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (int i = n_vec; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace dc::cpu_detail
