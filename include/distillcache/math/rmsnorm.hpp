#pragma once
// RMSNorm (Zhang & Sennrich 2019), as Llama/Mistral use it: y = x * rsqrt(mean(x^2) + eps) * w.
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

// The factor every element of a row is multiplied by, given the row's sum of squares.
DC_HD float rms_inv(float sum_squares, int n, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(n) + eps);
}

}  // namespace dc::math
