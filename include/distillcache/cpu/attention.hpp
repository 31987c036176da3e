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
#include "dot.hpp"

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
      const float* qv = q + (std::int64_t(t) * s.num_heads + h) * hd;
      const int kvh = math::kv_head_of(h, s.num_heads, s.num_kv_heads);
      const std::int32_t* kp = key_pos + std::int64_t(kvh) * s.capacity;
      const KV* kh = k_cache + std::int64_t(kvh) * s.capacity * hd;
      const KV* vh = v_cache + std::int64_t(kvh) * s.capacity * hd;
      float* o = out + (std::int64_t(t) * s.num_heads + h) * hd;

      float max_score = -INFINITY;
      for (int j = 0; j < len; ++j) {
        if (!math::attends(query_pos[t], kp[j], s.window)) {
          scores[std::size_t(j)] = -INFINITY;
          continue;
        }
        scores[std::size_t(j)] = cpu_detail::dot(qv, kh + std::int64_t(j) * hd, hd) * s.scale;
        max_score = fmaxf(max_score, scores[std::size_t(j)]);
      }
      for (int i = 0; i < hd; ++i) o[i] = 0.0f;
      if (max_score == -INFINITY) continue;  // nothing visible: cannot happen with the query cached
      float sum = 0.0f, weighted_score = 0.0f;
      for (int j = 0; j < len; ++j) {
        if (scores[std::size_t(j)] == -INFINITY) continue;
        const float shifted = scores[std::size_t(j)] - max_score;
        const float p = expf(shifted);
        scores[std::size_t(j)] = p;  // scores now hold unnormalised probabilities
        sum += p;
        weighted_score += p * shifted;
        const KV* vj = vh + std::int64_t(j) * hd;
        for (int i = 0; i < hd; ++i) o[i] += p * element_as_float(vj, i);
      }
      const float inv = 1.0f / sum;
      for (int i = 0; i < hd; ++i) o[i] *= inv;

      const int r = t - (n - observed);  // index among observed queries
      if (r < 0) continue;
      float* prow = probs + (std::size_t(r) * s.num_heads + h) * len;
      for (int j = 0; j < len; ++j)
        prow[j] = scores[std::size_t(j)] == -INFINITY ? 0.0f : scores[std::size_t(j)] * inv;
      entropy[std::size_t(r) * s.num_heads + h] =
          math::softmax_entropy(std::log(sum), weighted_score * inv);
    }
  }
  if (!observed) return;

  cpu_detail::fold_statistics_cpu(stats.block, probs, entropy, key_pos, query_pos + (n - observed),
                                  observed, len, s);
}

}  // namespace dc
