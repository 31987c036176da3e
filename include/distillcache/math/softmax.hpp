#pragma once
// Numerically stable softmax pieces shared by attention and the KL/Plackett-Luce code.
//
// OnlineSoftmax keeps a running max m and a running sum s = sum exp(x - m), so a row can be
// consumed in one pass (or in tiles, merged with combine) without overflow.
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

struct OnlineSoftmax {
  float max = -INFINITY;
  float sum = 0.0f;

  // Adds x; returns the factor by which earlier accumulated weights must be rescaled.
  DC_HD float push(float x) {
    if (x == -INFINITY) return 1.0f;  // weight 0; also keeps exp(-inf - -inf) = NaN out of sum
    if (x <= max) {
      sum += expf(x - max);
      return 1.0f;
    }
    const float rescale = (max == -INFINITY) ? 0.0f : expf(max - x);
    sum = sum * rescale + 1.0f;
    max = x;
    return rescale;
  }

  // Merges another partial state (e.g. from another thread or tile).
  DC_HD void combine(const OnlineSoftmax& o) {
    if (o.max == -INFINITY) return;
    if (max == -INFINITY) {
      *this = o;
      return;
    }
    const float m = fmaxf(max, o.max);
    sum = sum * expf(max - m) + o.sum * expf(o.max - m);
    max = m;
  }

  DC_HD float log_sum_exp() const { return max + logf(sum); }
};

// The weighted sum w = sum_j e^(s_j - m) (s_j - m) that an attention row keeps for its entropy
// (next to l = sum_j e^(s_j - m)), moved from its max m to a new max M >= m, given
// rescale = e^(m - M): each term e^(s-m) (s-m) becomes e^(s-M) (s-M) = rescale (e^(s-m) (s-m) +
// e^(s-m) (m-M)), so w becomes rescale (w + (m - M) l). A state with nothing in it (m = -inf,
// l = w = 0) moves to 0 (the formula would give 0 * inf).
DC_HD float rebased_weighted_sum(float w, float l, float m, float M, float rescale) {
  return m == -INFINITY ? 0.0f : rescale * (w + (m - M) * l);
}

}  // namespace dc::math
