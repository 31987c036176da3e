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

// How many leading slots of an ascending keep-set stay where they are (head_keep[i] == i): a
// compaction moves nothing before the first evicted slot.
inline int slots_in_place(const std::int32_t* head_keep, int count) {
  int i = 0;
  while (i < count && head_keep[i] == i) ++i;
  return i;
}

// Per-head compaction: KV head h keeps slots keep[h*count] < keep[h*count + 1] < ... (count of
// them, moved to the front in that order) of its K/V rows and its statistics rows. In place:
// keep[h*count + i] >= i, so a forward copy never overwrites a row still needed.
template <class KV>
void kv_compact(const Context<cpu>&, KV* k_cache, KV* v_cache, float* stats, int kv_heads, int head_dim,
                int rows_of_stats, int capacity, std::span<const std::int32_t> keep, int count) {
  for (int h = 0; h < kv_heads; ++h) {
    const std::int32_t* head_keep = keep.data() + std::size_t(h) * count;
    // Slots before the first evicted one stay where they are (keep is ascending, so once
    // head_keep[i] != i it stays so). After it, the kept slots come in runs of consecutive slots,
    // and runs only ever move towards the front (head_keep[i] >= i): std::copy front to back is
    // safe for such overlaps. K/V rows move run by run. Statistics rows too where the runs are
    // long (a decode-time eviction drops a chunk of 16 of B + 16 slots: a few runs of hundreds);
    // where they are short (a prompt compressed to a quarter: runs of one or two slots), a slot
    // by slot gather is cheaper than a copy call per run and row. Either way the same values.
    const int first = slots_in_place(head_keep, count);
    int runs = 0;
    for (int i = first; i < count; ++i) runs += i == first || head_keep[i] != head_keep[i - 1] + 1 ? 1 : 0;
    const bool stats_by_run = std::int64_t(runs) * 16 <= std::int64_t(count - first);
    for (int i = first; i < count;) {
      int end = i + 1;
      while (end < count && head_keep[end] == head_keep[end - 1] + 1) ++end;
      const std::int64_t run = end - i;
      const std::int64_t src = (std::int64_t(h) * capacity + head_keep[i]) * head_dim;
      const std::int64_t dst = (std::int64_t(h) * capacity + i) * head_dim;
      std::copy(k_cache + src, k_cache + src + run * head_dim, k_cache + dst);
      std::copy(v_cache + src, v_cache + src + run * head_dim, v_cache + dst);
      if (stats && stats_by_run)
        for (int r = 0; r < rows_of_stats; ++r) {
          float* row = stats + (std::int64_t(h) * rows_of_stats + r) * capacity;
          std::copy(row + head_keep[i], row + head_keep[i] + run, row + i);
        }
      i = end;
    }
    if (stats && !stats_by_run)
      for (int r = 0; r < rows_of_stats; ++r) {
        float* row = stats + (std::int64_t(h) * rows_of_stats + r) * capacity;
        for (int i = first; i < count; ++i) row[i] = row[head_keep[i]];
      }
  }
}

}  // namespace dc
