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

// Statistics are kept per (KV head, slot), so that every KV head may hold its own keep-set.
// A layer's block is [kv_heads, stat_rows_per_kv_head(group), capacity] with group = query heads
// per KV head: row r of KV head h, slot j at block[(h * rows + r) * capacity + j]. The sums over
// "heads" below run over the group's query heads only; coarser features (a keep-set shared by
// the heads of a layer, or by every layer) add the KV heads' rows up (cache/features.hpp).
enum StatRow : int {
  kStatMass = 0,         // sum over observed queries and the group's heads of a_qhi
  kStatEntropyMass = 1,  // sum over observed queries and the group's heads of a_qhi * H(q, h)
  kStatQueries = 2,      // number of observed queries that could see the slot
  kStatValueNorm = 3,    // ||v||_2 of this KV head's value (set when the slot is written)
  kStatKeyNorm = 4,      // ||k||_2 of this KV head's key after RoPE (set when written)
  kStatLastMass = 5,     // sum over the group's heads of the newest observed query's attention
  kStatHeadMass = 6,     // first of `group` rows: per query head of the group, sum over queries
};

DC_HD int stat_rows_per_kv_head(int group_size) { return kStatHeadMass + group_size; }

// Floats in one layer's statistics block.
DC_HD long long stat_block_floats(int num_heads, int num_kv_heads, int capacity) {
  return static_cast<long long>(num_kv_heads) * stat_rows_per_kv_head(num_heads / num_kv_heads) *
         capacity;
}

namespace math {

// Shannon entropy (nats) of a softmax row from its log-partition and the probability-weighted
// mean score: H = log Z - E_p[s] (with s the scaled scores, Z = sum exp(s)).
DC_HD float softmax_entropy(float log_partition, float expected_score) {
  return log_partition - expected_score;
}

// alpha: mass per (head x query), given the layer-summed mass and observed-query counts.
// The divisions below run unconditionally and a select discards a division by zero: the same
// results as a branch, and a loop over rows (gather_features) vectorises only without branches.
DC_HD float feature_alpha(float mass_sum, float query_sum, int num_heads) {
  const float alpha = mass_sum / (query_sum * static_cast<float>(num_heads));
  return query_sum > 0.0f ? alpha : 0.0f;
}

// H: attention-weighted mean entropy of the queries attending to the token.
DC_HD float feature_entropy(float entropy_mass_sum, float mass_sum) {
  const float entropy = entropy_mass_sum / mass_sum;
  return mass_sum > 0.0f ? entropy : 0.0f;
}

// pos: normalised position; the newest token has 1.
DC_HD float feature_position(int position, int latest_position) {
  const float relative = static_cast<float>(position) / static_cast<float>(latest_position);
  return latest_position > 0 ? relative : 1.0f;
}

// H2O's score of a slot (Zhang et al. 2023): +inf for the `recent` newest positions (position >
// latest - recent: always kept), else the attention mass it accumulated. H2OPolicy on the host
// and the in-place eviction's kernel (decode/in_place_eviction.cuh) both score with it, so they
// choose the same keep-sets.
DC_HD float h2o_score(int position, int latest_position, int recent, float accumulated_mass) {
  return position > latest_position - recent ? INFINITY : accumulated_mass;
}

// Welford-free variance of n values from their sum and sum of squares (n small: heads).
DC_HD float variance_from_sums(float sum, float sum_squares, int n) {
  const float mean = sum / static_cast<float>(n);
  const float v = sum_squares / static_cast<float>(n) - mean * mean;
  return v > 0.0f ? v : 0.0f;
}

// Folds the observed queries' attention to one slot of one KV head into that slot's statistics
// (block: the KV head's rows, [stat_rows_per_kv_head(num_heads), capacity]), in the fixed order
// (observed query r, then the group's head h) both backends use, so their sums agree and do not
// depend on the thread count. sees(r): can observed query r see the slot; prob(r, h, p,
// entropy): the probability of row (r, h) for the slot (h indexes the group) and that row's
// entropy.
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
