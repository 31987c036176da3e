#pragma once
// RMSNorm (Zhang & Sennrich 2019), as Llama/Mistral use it: y = x * rsqrt(mean(x^2) + eps) * w.
//
// Gemma defines its norms as y = x * rsqrt(mean(x^2) + eps) * (1 + w), storing w around 0. The
// kernels take the multiplier (one code path for every model), so a loader of a Gemma checkpoint
// stores offset_norm_multiplier(w) = 1 + w in the weights, formed once in fp32 exactly as
// Hugging Face forms it per call (1.0 + weight.float()); the products are then the same.
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

// The factor every element of a row is multiplied by, given the row's sum of squares.
DC_HD float rms_inv(float sum_squares, int n, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(n) + eps);
}

// The multiplier of a Gemma-style (1 + w) norm weight.
DC_HD float offset_norm_multiplier(float w) { return 1.0f + w; }

}  // namespace dc::math
