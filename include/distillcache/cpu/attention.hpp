#pragma once
// CPU grouped-query attention of a chunk of queries over the KV cache, with the per-slot
// statistics eviction policies read (math/features.hpp), plus the cache's write and compaction.
//
// Keys and values are [kv_heads, capacity, head_dim]; slots [0, len) are valid and slot j holds
// the token at position key_pos[j]. Query t (position query_pos[t]) sees slot j iff
// math::attends(query_pos[t], key_pos[j], window): the mask follows positions, so the same code
// serves prefill, decode, sliding windows and evicted (compacted) caches.
//
// Statistics are fused: the probabilities of observed queries are kept from the softmax (no
// second pass over K or V) and folded into the slot accumulators in a fixed order, so the sums
// do not depend on the thread count.
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

// Writes the chunk's k/v rows [n, kv_heads*head_dim] into cache slots [first, first + n) and,
// with a statistics block, resets the new slots' accumulators and records their K/V norms.
inline void kv_write(const Context<cpu>&, float* k_cache, float* v_cache, const float* k,
                     const float* v, int n, int first, const AttentionShape& s,
                     float* stats = nullptr) {
  for (int t = 0; t < n; ++t) {
    float key_norm = 0.0f, value_norm = 0.0f;
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const std::int64_t src = (std::int64_t(t) * s.num_kv_heads + h) * s.head_dim;
      const std::int64_t dst = (std::int64_t(h) * s.capacity + first + t) * s.head_dim;
      float kk = 0.0f, vv = 0.0f;
      for (int i = 0; i < s.head_dim; ++i) {
        k_cache[dst + i] = k[src + i];
        v_cache[dst + i] = v[src + i];
        kk += k[src + i] * k[src + i];
        vv += v[src + i] * v[src + i];
      }
      key_norm += std::sqrt(kk);
      value_norm += std::sqrt(vv);
    }
    if (!stats) continue;
    const std::int64_t slot = first + t;
    for (int r = 0; r < stat_rows(s.num_heads); ++r) stats[std::int64_t(r) * s.capacity + slot] = 0.0f;
    stats[std::int64_t(kStatKeyNorm) * s.capacity + slot] = key_norm / float(s.num_kv_heads);
    stats[std::int64_t(kStatValueNorm) * s.capacity + slot] = value_norm / float(s.num_kv_heads);
  }
}

// Keeps slots keep[0] < keep[1] < ... (moved to the front in order) of every KV head and
// statistics row. In place: keep[i] >= i, so a forward copy never overwrites a row still needed.
inline void kv_compact(const Context<cpu>&, float* k_cache, float* v_cache, float* stats,
                       int kv_heads, int head_dim, int rows_of_stats, int capacity,
                       std::span<const std::int32_t> keep) {
  const int count = int(keep.size());
  for (int h = 0; h < kv_heads; ++h) {
    for (int i = 0; i < count; ++i) {
      const std::int64_t src = (std::int64_t(h) * capacity + keep[std::size_t(i)]) * head_dim;
      const std::int64_t dst = (std::int64_t(h) * capacity + i) * head_dim;
      if (src == dst) continue;
      for (int e = 0; e < head_dim; ++e) {
        k_cache[dst + e] = k_cache[src + e];
        v_cache[dst + e] = v_cache[src + e];
      }
    }
  }
  for (int r = 0; r < rows_of_stats; ++r) {
    float* row = stats + std::int64_t(r) * capacity;
    for (int i = 0; i < count; ++i) row[i] = row[keep[std::size_t(i)]];
  }
}

// out[n, heads*head_dim] = softmax(q K^T * scale + mask) V, per query head; accumulates the
// statistics of observed queries into stats.block when given.
inline void attention(const Context<cpu>&, float* out, const float* q, const float* k_cache,
                      const float* v_cache, const std::int32_t* key_pos, int len,
                      const std::int32_t* query_pos, int n, const AttentionShape& s,
                      AttentionStats stats = {}) {
  const int hd = s.head_dim;
  const int observed = stats.block ? std::max(0, n - stats.first_observed) : 0;
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
      const float* kh = k_cache + std::int64_t(kvh) * s.capacity * hd;
      const float* vh = v_cache + std::int64_t(kvh) * s.capacity * hd;
      float* o = out + (std::int64_t(t) * s.num_heads + h) * hd;

      float max_score = -INFINITY;
      for (int j = 0; j < len; ++j) {
        if (!math::attends(query_pos[t], key_pos[j], s.window)) {
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
        const float* vj = vh + std::int64_t(j) * hd;
        for (int i = 0; i < hd; ++i) o[i] += p * vj[i];
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

  // Fold the observed rows into the slot accumulators: parallel over slots, fixed order inside.
  float* block = stats.block;
  const std::int64_t cap = s.capacity;
  DC_OMP(parallel for schedule(static) if (len > 4096))
  for (int j = 0; j < len; ++j) {
    math::fold_slot_statistics(
        block, cap, j, observed, s.num_heads,
        [&](int r) { return math::attends(query_pos[n - observed + r], key_pos[j], s.window); },
        [&](int r, int h, float& p, float& row_entropy) {
          p = probs[(std::size_t(r) * s.num_heads + h) * len + std::size_t(j)];
          row_entropy = entropy[std::size_t(r) * s.num_heads + h];
        });
  }
}

}  // namespace dc
