#pragma once
// CPU grouped-query attention of a chunk of queries over the KV cache, with the per-slot
// statistics eviction policies read (math/features.hpp). The cache's writes and compaction are
// in cpu/kv.hpp.
//
// Keys and values are [kv_heads, capacity, head_dim], positions [kv_heads, capacity]; slots
// [0, len) of every KV head are valid and slot j of head g holds the token at position
// key_pos[g * capacity + j] (each KV head may hold its own keep-set). Query t (position
// query_pos[t]) sees that slot iff math::attends(query_pos[t], key_pos[g * capacity + j], window):
// the mask follows positions, so the same code serves prefill, decode, sliding windows and
// evicted (compacted) caches, shared or per head.
//
// Statistics are fused: the probabilities of observed queries are kept from the softmax (no
// second pass over K or V) and folded into the slot accumulators in a fixed order, so the sums
// do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/attention_rules.hpp"
#include "../math/attention_shape.hpp"
#include "../math/features.hpp"
#include "../math/exp_poly.hpp"
#include "gemm.hpp"

namespace dc {

namespace cpu_detail {

// Folds the probabilities of the observed queries (probs [observed, heads, len], row entropies
// [observed, heads], zero where a query cannot see a slot) into the slot accumulators of every
// KV head. Each slot receives exactly math::fold_slot_statistics's sums, in its order (observed
// query r, then the group's head h), so the result is bitwise the per-slot formula's and the
// CUDA kernel's order; only the loops are turned inside out (slots innermost, in runs of kRun)
// so that the compiler vectorises them: a decode step at 8k context folds 24k slots per layer,
// and the per-slot loop with its strided rows cost several times the attention's own writes.
// Skipping an unseen (r, slot), as the per-slot formula does, and adding its zero probability
// give the same bits: the sums start at +0 and every added term is +0.
inline void fold_statistics_cpu(float* block, const float* probs, const float* entropy,
                                const std::int32_t* key_pos, const std::int32_t* observed_pos,
                                int observed, int len, const AttentionShape& s) {
  constexpr int kRun = 256;
  const int group = s.num_heads / s.num_kv_heads;
  const int rows = stat_rows_per_kv_head(group);
  const std::int64_t cap = s.capacity;
  const int runs_per_head = (len + kRun - 1) / kRun;
  const int tasks = s.num_kv_heads * runs_per_head;
  DC_OMP(parallel for schedule(static) if (std::int64_t(s.num_kv_heads) * len > 4096))
  for (int task = 0; task < tasks; ++task) {
    const int g = task / runs_per_head;
    const int j0 = (task % runs_per_head) * kRun;
    const int m = std::min(kRun, len - j0);
    float* kv_block = block + std::int64_t(g) * rows * cap + j0;
    const std::int32_t* keys = key_pos + std::int64_t(g) * cap + j0;
    float mass[kRun] = {}, entropy_mass[kRun] = {}, queries[kRun] = {}, last[kRun] = {};
    for (int r = 0; r < observed; ++r) {
      const int qp = observed_pos[r];
      for (int j = 0; j < m; ++j) queries[j] += math::attends(qp, keys[j], s.window) ? 1.0f : 0.0f;
      for (int h = 0; h < group; ++h) {
        const std::size_t row = std::size_t(r) * s.num_heads + std::size_t(g) * group + h;
        const float* p = probs + row * len + j0;
        const float row_entropy = entropy[row];
        float* head_mass = kv_block + (kStatHeadMass + h) * cap;
        for (int j = 0; j < m; ++j) {
          mass[j] += p[j];
          entropy_mass[j] += p[j] * row_entropy;
          head_mass[j] += p[j];
        }
        if (r == observed - 1)
          for (int j = 0; j < m; ++j) last[j] += p[j];
      }
    }
    for (int j = 0; j < m; ++j) {
      kv_block[kStatMass * cap + j] += mass[j];
      kv_block[kStatEntropyMass * cap + j] += entropy_mass[j];
      kv_block[kStatQueries * cap + j] += queries[j];
      kv_block[kStatLastMass * cap + j] = last[j];
    }
  }
}

// One query head over len cached slots: out = softmax(q K^T * scale + mask) V. Leaves scores
// holding the unnormalised probabilities exp(score - max) (0 where masked) and returns their sum
// and sum p * (score - max) for the entropy (sum 0: nothing visible, out 0).
//
// Written for the decode step, where this runs once per cached token per head per step: the
// scores are the GEMM micro-kernel's dot products (6 keys per call), the exponentials
// math::exp_nonpositive (vectorised; glibc's expf is a call per key). The sums and the output run
// in slot order, one chain each, so a masked slot adds an exact zero: dropping it from the cache
// (trimming to a window, evicting what no query sees) changes no bit, and results depend on
// neither threads nor batch.
struct HeadSoftmax {
  float sum = 0.0f;
  float weighted_score = 0.0f;
};

template <class KV>
inline HeadSoftmax attend_one_head(float* DC_RESTRICT o, float* DC_RESTRICT scores, const float* DC_RESTRICT qv,
                                   const KV* DC_RESTRICT kh, const KV* DC_RESTRICT vh,
                                   const std::int32_t* DC_RESTRICT kp, int len, int query_pos,
                                   const AttentionShape& s) {
  const int hd = s.head_dim;
  constexpr int kKeysPerCall = 6;
  for (int j = 0; j < len; j += kKeysPerCall)
    gemm_tile<1, kKeysPerCall>(scores + j, 0, qv, kh + std::int64_t(j) * hd, hd, 1,
                               std::min(kKeysPerCall, len - j), false);
  float max_score = -INFINITY;
  for (int j = 0; j < len; ++j) {
    scores[j] = math::attends(query_pos, kp[j], s.window) ? scores[j] * s.scale : -INFINITY;
    max_score = fmaxf(max_score, scores[j]);
  }
  for (int i = 0; i < hd; ++i) o[i] = 0.0f;
  if (max_score == -INFINITY) return {};  // nothing visible: cannot happen with the query cached

  // In blocks: the exponentials vectorise, the sums run in slot order.
  HeadSoftmax result;
  constexpr int kBlock = 64;
  for (int j0 = 0; j0 < len; j0 += kBlock) {
    const int m = std::min(kBlock, len - j0);
    float shifted[kBlock], p[kBlock];
    for (int j = 0; j < m; ++j) shifted[j] = scores[j0 + j] - max_score;  // -inf where masked
    for (int j = 0; j < m; ++j) p[j] = math::exp_nonpositive(shifted[j]);
    for (int j = 0; j < m; ++j) {
      result.sum += p[j];
      result.weighted_score += p[j] > 0.0f ? p[j] * shifted[j] : 0.0f;
      scores[j0 + j] = p[j];
    }
  }

  // o = sum_j p_j v_j / sum, in slot order; j outer so each V row is read once.
  const float inv = 1.0f / result.sum;
  for (int j = 0; j < len; ++j) {
    const KV* vj = vh + std::int64_t(j) * hd;
    const float p = scores[j];
    for (int i = 0; i < hd; ++i) o[i] = multiply_add(p, element_as_float(vj, i), o[i]);
  }
  for (int i = 0; i < hd; ++i) o[i] *= inv;
  return result;
}

}  // namespace cpu_detail

// out[n, heads*head_dim] = softmax(q K^T * scale + mask) V, per query head; accumulates the
// statistics of observed queries into stats.block when given. K and V are stored as KV (float
// or bf16: the cache's storage type) and widened to fp32 as they are read.
template <class KV>
void attention(const Context<cpu>&, float* out, const float* q, const KV* k_cache, const KV* v_cache,
               const std::int32_t* key_pos, int len, const std::int32_t* query_pos, int n,
               const AttentionShape& s, AttentionStats stats = {}) {
  const int hd = s.head_dim;
  // Observed queries are t in [first_observed, n), first_observed clamped to [0, n] as the CUDA
  // overload does (a negative one means every query).
  const int observed = stats.block ? n - std::clamp(stats.first_observed, 0, n) : 0;
  // Probabilities [observed, heads, len] and row entropies [observed, heads] of observed queries.
  // Scratch of the calling thread, shared with the OpenMP workers through plain pointers.
  thread_local std::vector<float> probs_scratch, entropy_scratch;
  if (observed) {
    probs_scratch.assign(std::size_t(observed) * s.num_heads * len, 0.0f);
    entropy_scratch.assign(std::size_t(observed) * s.num_heads, 0.0f);
  }
  float* const probs = probs_scratch.data();
  float* const entropy = entropy_scratch.data();

  DC_OMP(parallel for collapse(2) schedule(static))
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < s.num_heads; ++h) {
      thread_local std::vector<float> scores;
      scores.resize(static_cast<std::size_t>(len));
      const int kvh = math::kv_head_of(h, s.num_heads, s.num_kv_heads);
      float* o = out + (std::int64_t(t) * s.num_heads + h) * hd;
      const cpu_detail::HeadSoftmax softmax = cpu_detail::attend_one_head(
          o, scores.data(), q + (std::int64_t(t) * s.num_heads + h) * hd,
          k_cache + std::int64_t(kvh) * s.capacity * hd, v_cache + std::int64_t(kvh) * s.capacity * hd,
          key_pos + std::int64_t(kvh) * s.capacity, len, query_pos[t], s);

      const int r = t - (n - observed);  // index among observed queries
      if (r < 0 || softmax.sum == 0.0f) continue;
      const float inv = 1.0f / softmax.sum;
      float* prow = probs + (std::size_t(r) * s.num_heads + h) * len;
      for (int j = 0; j < len; ++j) prow[j] = scores[std::size_t(j)] * inv;
      entropy[std::size_t(r) * s.num_heads + h] =
          math::softmax_entropy(std::log(softmax.sum), softmax.weighted_score * inv);
    }
  }
  if (!observed) return;

  cpu_detail::fold_statistics_cpu(stats.block, probs, entropy, key_pos, query_pos + (n - observed),
                                  observed, len, s);
}

}  // namespace dc
