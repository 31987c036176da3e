#pragma once
// CPU grouped-query attention of a chunk of queries over the KV cache.
//
// Keys and values are [kv_heads, capacity, head_dim]; slots [0, len) are valid and slot j holds
// the token at position key_pos[j]. Query t (position query_pos[t]) sees slot j iff
// math::attends(query_pos[t], key_pos[j], window): the mask follows positions, so the same code
// serves prefill, decode, sliding windows and evicted (compacted) caches.
#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/attention_rules.hpp"
#include "../math/attention_shape.hpp"

namespace dc {

// Writes the chunk's k/v rows [n, kv_heads*head_dim] into cache slots [first, first + n).
inline void kv_write(const Context<cpu>&, float* k_cache, float* v_cache, const float* k,
                     const float* v, int n, int first, const AttentionShape& s) {
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const std::int64_t src = (std::int64_t(t) * s.num_kv_heads + h) * s.head_dim;
      const std::int64_t dst = (std::int64_t(h) * s.capacity + first + t) * s.head_dim;
      for (int i = 0; i < s.head_dim; ++i) {
        k_cache[dst + i] = k[src + i];
        v_cache[dst + i] = v[src + i];
      }
    }
  }
}

// out[n, heads*head_dim] = softmax(q K^T * scale + mask) V, per query head.
inline void attention(const Context<cpu>&, float* out, const float* q, const float* k_cache,
                      const float* v_cache, const std::int32_t* key_pos, int len,
                      const std::int32_t* query_pos, int n, const AttentionShape& s) {
  const int hd = s.head_dim;
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
        const float* kj = kh + std::int64_t(j) * hd;
        float dot = 0.0f;
        for (int i = 0; i < hd; ++i) dot += qv[i] * kj[i];
        scores[std::size_t(j)] = dot * s.scale;
        max_score = fmaxf(max_score, scores[std::size_t(j)]);
      }
      for (int i = 0; i < hd; ++i) o[i] = 0.0f;
      if (max_score == -INFINITY) continue;  // nothing visible: cannot happen with the query cached
      float sum = 0.0f;
      for (int j = 0; j < len; ++j) {
        if (scores[std::size_t(j)] == -INFINITY) continue;
        const float p = expf(scores[std::size_t(j)] - max_score);
        sum += p;
        const float* vj = vh + std::int64_t(j) * hd;
        for (int i = 0; i < hd; ++i) o[i] += p * vj[i];
      }
      const float inv = 1.0f / sum;
      for (int i = 0; i < hd; ++i) o[i] *= inv;
    }
  }
}

}  // namespace dc
