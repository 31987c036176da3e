#pragma once
// CPU KV-cache writes and compaction: the chunk's K/V rows into their slots, and the in-place
// compaction that applies per-head keep-sets after eviction (cuda/kv.cuh mirrors both).
//
// Layouts (cache/kv_cache.hpp): K/V [kv_heads, capacity, head_dim]; statistics
// [kv_heads, rows, capacity] (rows = stat_rows_per_kv_head(group), math/features.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "../core/backend.hpp"
#include "../core/dtype.hpp"
#include "../math/attention_shape.hpp"
#include "../math/features.hpp"

namespace dc {

// Writes the chunk's k/v rows [n, kv_heads*head_dim] into cache slots [first, first + n), stored
// as KV (float, or bf16 rounded to nearest even) and, with a statistics block, resets the new
// slots' accumulators and records each KV head's K/V norms (of the fp32 rows, so the statistics
// do not depend on the storage type).
template <class KV>
void kv_write(const Context<cpu>&, KV* k_cache, KV* v_cache, const float* k, const float* v, int n, int first,
              const AttentionShape& s, float* stats = nullptr) {
  const int rows = stat_rows_per_kv_head(s.num_heads / s.num_kv_heads);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const std::int64_t src = (std::int64_t(t) * s.num_kv_heads + h) * s.head_dim;
      const std::int64_t dst = (std::int64_t(h) * s.capacity + first + t) * s.head_dim;
      float kk = 0.0f, vv = 0.0f;
      for (int i = 0; i < s.head_dim; ++i) {
        k_cache[dst + i] = from_float<KV>(k[src + i]);
        v_cache[dst + i] = from_float<KV>(v[src + i]);
        kk += k[src + i] * k[src + i];
        vv += v[src + i] * v[src + i];
      }
      if (!stats) continue;
      float* head_rows = stats + std::int64_t(h) * rows * s.capacity;
      const std::int64_t slot = first + t;
      for (int r = 0; r < rows; ++r) head_rows[std::int64_t(r) * s.capacity + slot] = 0.0f;
      head_rows[std::int64_t(kStatKeyNorm) * s.capacity + slot] = std::sqrt(kk);
      head_rows[std::int64_t(kStatValueNorm) * s.capacity + slot] = std::sqrt(vv);
    }
  }
}

// Per-head compaction: KV head h keeps slots keep[h*count] < keep[h*count + 1] < ... (count of
// them, moved to the front in that order) of its K/V rows and its statistics rows. In place:
// keep[h*count + i] >= i, so a forward copy never overwrites a row still needed.
template <class KV>
void kv_compact(const Context<cpu>&, KV* k_cache, KV* v_cache, float* stats, int kv_heads, int head_dim,
                int rows_of_stats, int capacity, std::span<const std::int32_t> keep, int count) {
  for (int h = 0; h < kv_heads; ++h) {
    const std::int32_t* head_keep = keep.data() + std::size_t(h) * count;
    // Kept slots come in runs of consecutive slots (all but the evicted few): one move per run.
    // Runs only ever move towards the front (keep is ascending, so head_keep[i] >= i), and
    // std::copy front-to-back is safe for such overlaps.
    for (int i = 0; i < count;) {
      int end = i + 1;
      while (end < count && head_keep[end] == head_keep[end - 1] + 1) ++end;
      if (head_keep[i] != i) {
        const std::int64_t src = (std::int64_t(h) * capacity + head_keep[i]) * head_dim;
        const std::int64_t dst = (std::int64_t(h) * capacity + i) * head_dim;
        const std::int64_t elements = std::int64_t(end - i) * head_dim;
        std::copy(k_cache + src, k_cache + src + elements, k_cache + dst);
        std::copy(v_cache + src, v_cache + src + elements, v_cache + dst);
      }
      i = end;
    }
    if (!stats) continue;
    for (int r = 0; r < rows_of_stats; ++r) {
      float* row = stats + (std::int64_t(h) * rows_of_stats + r) * capacity;
      for (int i = 0; i < count; ++i) row[i] = row[head_keep[i]];
    }
  }
}

}  // namespace dc
