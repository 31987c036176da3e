#pragma once
// Expected attention (kvpress's ExpectedAttentionPress, Devoto et al. 2025): how much attention
// the *future* queries are expected to pay each cached key, from the mean and covariance of the
// queries seen so far.
//
// Queries q = W_q x (before RoPE) are modelled as Gaussian, q ~ N(mu, C) per head. A future query
// at position p is R_p q (R_p: RoPE's rotation at p), and for a key k the softmax logit
// z = q.k / sqrt(d) has E[exp(z)] = exp(mu'.k / sqrt(d) + k' C' k / (2 d)) when mu' = R mu and
// C' = R C R^T. R is replaced by the mean rotation over the next n_future positions,
// R = mean_p R_p = diag(cbar) + diag(sbar) P (rotate-half pairs (i, i + d/2): cbar_i, sbar_i the
// mean cosine and sine of pair i's angle), as kvpress does. The score of a key is then the
// softmax of those logits over the cache, averaged over a KV group's query heads and scaled by
// the key's ||v||; cache/expected_attention.hpp applies it.
//
// Accumulation is in double: the covariance is E[qq^T] - mu mu^T, a difference of large terms.
#include <cmath>

#include "../core/config.hpp"
#include "rope.hpp"

namespace dc::math {

// Mean cosine and sine of pair `pair`'s RoPE angle over positions [first, first + count).
DC_HD void mean_rotation(int first, int count, int pair, int head_dim, float theta, double& cbar,
                         double& sbar) {
  const float inv_freq = rope_inv_freq(pair, head_dim, theta);
  double c = 0.0, s = 0.0;
  for (int p = first; p < first + count; ++p) {
    const float angle = rope_angle(p, inv_freq);  // fp32, as the forward pass rotates keys
    c += cos(double(angle));
    s += sin(double(angle));
  }
  cbar = c / count;
  sbar = s / count;
}

// y = R x for the mean rotation of a rotate-half head: cbar, sbar have head_dim / 2 entries.
DC_HD void apply_mean_rotation(const double* x, double* y, const double* cbar, const double* sbar,
                               int head_dim) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    y[i] = cbar[i] * x[i] - sbar[i] * x[i + half];
    y[i + half] = cbar[i] * x[i + half] + sbar[i] * x[i];
  }
}

// The expected logit of a key: mu'.k / sqrt(d) + k' C' k / (2 d), mu' [d], C' [d, d] row-major.
DC_HD double expected_logit(const float* key, const double* mu, const double* cov, int head_dim) {
  double linear = 0.0, quadratic = 0.0;
  for (int i = 0; i < head_dim; ++i) {
    linear += mu[i] * key[i];
    double row = 0.0;
    for (int j = 0; j < head_dim; ++j) row += cov[i * head_dim + j] * key[j];
    quadratic += key[i] * row;
  }
  return linear / sqrt(double(head_dim)) + quadratic / (2.0 * head_dim);
}

}  // namespace dc::math
