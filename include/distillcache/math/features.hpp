#pragma once
// Per-token attention statistics and the five DistillCache features formed from them.
//
// While attention runs, every cached slot of every layer accumulates a few sums (the StatRow
// rows below) from the queries that are "observed": the last W prompt queries at prefill, every
// query while decoding. The features of DESIGN.md are then ratios of sums over layers:
//   alpha  attention mass received, mean over heads, layers and observed queries
//   vnorm  ||v||_2, mean over layers and KV heads
//   sigma  variance across query heads of the (layer- and query-averaged) mass received
//   H      attention-weighted entropy of the queries attending to the token:
//          sum_q a_qi H(q) / sum_q a_qi
//   pos    position / latest position, in [0, 1]
// The formulas live here once, for the CPU code, the CUDA kernels and the learned policy.
#include <cmath>

#include "../core/config.hpp"

namespace dc {

// Rows of a layer's statistics block [stat_rows(num_heads), capacity]: row r, slot j at
// block[r * capacity + j].
enum StatRow : int {
  kStatMass = 0,         // sum over observed queries and heads of a_qhi
  kStatEntropyMass = 1,  // sum over observed queries and heads of a_qhi * H(q, h)
  kStatQueries = 2,      // number of observed queries that could see the slot
  kStatValueNorm = 3,    // mean over KV heads of ||v||_2 (set when the slot is written)
  kStatKeyNorm = 4,      // mean over KV heads of ||k||_2 after RoPE (set when written)
  kStatLastMass = 5,     // sum over heads of the attention of the most recent observed query
  kStatHeadMass = 6,     // first of num_heads rows: per query head, sum over observed queries
};

DC_HD int stat_rows(int num_heads) { return kStatHeadMass + num_heads; }

namespace math {

// Shannon entropy (nats) of a softmax row from its log-partition and the probability-weighted
// mean score: H = log Z - E_p[s] (with s the scaled scores, Z = sum exp(s)).
DC_HD float softmax_entropy(float log_partition, float expected_score) {
  return log_partition - expected_score;
}

// alpha: mass per (head x query), given the layer-summed mass and observed-query counts.
DC_HD float feature_alpha(float mass_sum, float query_sum, int num_heads) {
  return query_sum > 0.0f ? mass_sum / (query_sum * static_cast<float>(num_heads)) : 0.0f;
}

// H: attention-weighted mean entropy of the queries attending to the token.
DC_HD float feature_entropy(float entropy_mass_sum, float mass_sum) {
  return mass_sum > 0.0f ? entropy_mass_sum / mass_sum : 0.0f;
}

// pos: normalised position; the newest token has 1.
DC_HD float feature_position(int position, int latest_position) {
  return latest_position > 0 ? static_cast<float>(position) / static_cast<float>(latest_position) : 1.0f;
}

// Welford-free variance of n values from their sum and sum of squares (n small: heads).
DC_HD float variance_from_sums(float sum, float sum_squares, int n) {
  const float mean = sum / static_cast<float>(n);
  const float v = sum_squares / static_cast<float>(n) - mean * mean;
  return v > 0.0f ? v : 0.0f;
}

// Folds the observed queries' attention to one slot into that slot's statistics, in the fixed
// order (observed query r, then head h) both backends use, so their sums agree and do not depend
// on the thread count. sees(r): can observed query r see the slot; prob(r, h, p, entropy): the
// probability of row (r, h) for the slot and that row's entropy.
DC_EXEC_CHECK_DISABLE
template <class Sees, class Prob>
DC_HD void fold_slot_statistics(float* block, long long capacity, int slot, int observed,
                                int num_heads, Sees sees, Prob prob) {
  float mass = 0.0f, entropy_mass = 0.0f, queries = 0.0f, last = 0.0f;
  for (int r = 0; r < observed; ++r) {
    if (!sees(r)) continue;  // p = 0 for every head
    queries += 1.0f;
    for (int h = 0; h < num_heads; ++h) {
      float p = 0.0f, entropy = 0.0f;
      prob(r, h, p, entropy);
      mass += p;
      entropy_mass += p * entropy;
      block[(kStatHeadMass + h) * capacity + slot] += p;
      if (r == observed - 1) last += p;
    }
  }
  block[kStatMass * capacity + slot] += mass;
  block[kStatEntropyMass * capacity + slot] += entropy_mass;
  block[kStatQueries * capacity + slot] += queries;
  block[kStatLastMass * capacity + slot] = last;
}

}  // namespace math
}  // namespace dc
