#pragma once
// KL divergence between next-token distributions given as logits, and the pieces of it.
// KL(P || Q) = sum_v p_v (log p_v - log q_v), with log p = logit - logsumexp(logits).
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

// One vocabulary entry's contribution, from the two log-probabilities.
DC_HD float kl_term(float log_p, float log_q) {
  return log_p == -INFINITY ? 0.0f : expf(log_p) * (log_p - log_q);
}

}  // namespace dc::math
