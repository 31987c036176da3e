#pragma once
// CUDA KV-cache compaction (mirrors kv_compact in cpu/attention.hpp): keeps slots keep[0] <
// keep[1] < ... of every KV head and statistics row, moved to the front in that order.
//
// Why gather-then-scatter: the CPU loop is in place because it runs i = 0, 1, ... in order and
// keep[i] >= i, so a row is read before any later step overwrites it. Run in parallel, the thread
// moving keep[i] -> i may find that row i' = keep[i] was already overwritten by the thread moving
// keep[i'] -> i'. So each batch of destinations [a, b) is first gathered from its sources into
// workspace scratch (one kernel), then scattered to [a, b) (a second kernel on the same stream,
// so it starts after the gather finished). Batches run in ascending order and are race-free
// across each other too: batch [a, b) writes only slots < b, while every later batch reads
// sources keep[i] >= i >= b. Batching bounds the scratch (kCompactBatchBytes) whatever the cache
// length.
//
// Slots before the first evicted one (keep[i] == i) do not move and are skipped, so truncating
// keep-sets (and the identity) copy nothing.
//
// keep is a HOST span. Its moving part is copied into the workspace with copy_to_backend: from
// pageable memory cudaMemcpyAsync returns once the data is staged, and from pinned memory
// copy_to_backend waits for the stream, so the caller may free or reuse keep as soon as this
// returns. The kernels themselves stay queued on ctx.stream(), in order with everything else.
#include <cstddef>
#include <cstdint>
#include <span>

#include <cuda_runtime.h>

#include "../core/error.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"
#include "copy.cuh"

namespace dc {
namespace cuda_detail {

inline constexpr std::size_t kCompactBatchBytes = std::size_t(64) << 20;

// Moves a batch of `count` rows between the cache (destination slots first..first+count, or
// source slots src_slot[i]) and the scratch [kv_heads, count, head_dim] x2 + [rows, count].
// kGather: cache[src_slot[i]] -> scratch[i]; else scratch[i] -> cache[first + i].
template <bool kGather>
__global__ void kv_compact_kernel(float* DC_RESTRICT k_cache, float* DC_RESTRICT v_cache,
                                  float* DC_RESTRICT stats, float* DC_RESTRICT scratch,
                                  const std::int32_t* DC_RESTRICT src_slot, int count, int first,
                                  int kv_heads, int head_dim, int rows, int capacity) {
  const std::int64_t kv_count = std::int64_t(kv_heads) * count * head_dim;
  const std::int64_t total = 2 * kv_count + std::int64_t(rows) * count;
  float* const scratch_k = scratch;
  float* const scratch_v = scratch + kv_count;
  float* const scratch_s = scratch + 2 * kv_count;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    if (e < 2 * kv_count) {
      const bool is_v = e >= kv_count;
      const std::int64_t f = is_v ? e - kv_count : e;  // [kv_heads, count, head_dim]
      const int d = int(f % head_dim);
      const std::int64_t hi = f / head_dim;
      const int i = int(hi % count);
      const std::int64_t h = hi / count;
      const int slot = kGather ? src_slot[i] : first + i;
      float* cache = is_v ? v_cache : k_cache;
      float* buf = is_v ? scratch_v : scratch_k;
      const std::int64_t c = (h * capacity + slot) * head_dim + d;
      if constexpr (kGather) buf[f] = cache[c];
      else cache[c] = buf[f];
    } else {
      const std::int64_t f = e - 2 * kv_count;  // [rows, count]
      const int i = int(f % count);
      const std::int64_t r = f / count;
      const std::int64_t c = r * capacity + (kGather ? src_slot[i] : first + i);
      if constexpr (kGather) scratch_s[f] = stats[c];
      else stats[c] = scratch_s[f];
    }
  }
}

}  // namespace cuda_detail

// Keeps slots keep[0] < keep[1] < ... (host span, strictly ascending, each < capacity) of every
// KV head of k_cache/v_cache [kv_heads, capacity, head_dim] and of the rows_of_stats rows of
// stats [rows_of_stats, capacity] (device pointers; stats may be null with rows_of_stats 0).
// Slots past keep.size() keep stale data, as on the CPU.
inline void kv_compact(const Context<cuda>& ctx, float* k_cache, float* v_cache, float* stats,
                       int kv_heads, int head_dim, int rows_of_stats, int capacity,
                       std::span<const std::int32_t> keep) {
  const int count = int(keep.size());
  DC_CHECK(count <= capacity, "kv_compact: keep-set of ", count, " slots exceeds capacity ",
           capacity);
  int fixed = 0;  // keep[i] == i for i < fixed: rows that stay where they are
  for (int i = 0; i < count; ++i) {
    const std::int32_t slot = keep[std::size_t(i)];
    DC_CHECK(slot >= 0 && slot < capacity, "kv_compact: slot ", slot, " outside [0, ", capacity,
             ")");
    DC_CHECK(i == 0 || slot > keep[std::size_t(i) - 1],
             "kv_compact: keep-set must be strictly ascending");
    if (slot == i && fixed == i) fixed = i + 1;
  }
  const int moving = count - fixed;
  if (moving == 0) return;
  if (!stats) rows_of_stats = 0;

  using namespace cuda_detail;
  const std::size_t row_floats = std::size_t(2) * kv_heads * head_dim + std::size_t(rows_of_stats);
  std::size_t batch = kCompactBatchBytes / (row_floats * sizeof(float));
  if (batch < 1) batch = 1;
  if (batch > std::size_t(moving)) batch = std::size_t(moving);
  // One workspace request: the source slots (int32, padded to 16 bytes), then the scratch.
  const std::size_t slot_floats = (std::size_t(moving) + 3) / 4 * 4;
  float* ws = ctx.workspace_as<float>(slot_floats + batch * row_floats);
  auto* src_slots = reinterpret_cast<std::int32_t*>(ws);
  float* scratch = ws + slot_floats;
  copy_to_backend(ctx, src_slots, keep.data() + fixed, std::size_t(moving));

  constexpr int kThreads = 256;
  for (int a = 0; a < moving; a += int(batch)) {
    const int cnt = moving - a < int(batch) ? moving - a : int(batch);
    const std::int64_t elems = std::int64_t(cnt) * std::int64_t(row_floats);
    const unsigned grid = grid_for(elems, kThreads, 8 * ctx.sm_count());
    kv_compact_kernel<true><<<grid, kThreads, 0, ctx.stream()>>>(
        k_cache, v_cache, stats, scratch, src_slots + a, cnt, fixed + a, kv_heads, head_dim,
        rows_of_stats, capacity);
    DC_CUDA_CHECK_LAUNCH("kv_compact_kernel<gather>");
    kv_compact_kernel<false><<<grid, kThreads, 0, ctx.stream()>>>(
        k_cache, v_cache, stats, scratch, src_slots + a, cnt, fixed + a, kv_heads, head_dim,
        rows_of_stats, capacity);
    DC_CUDA_CHECK_LAUNCH("kv_compact_kernel<scatter>");
  }
}

}  // namespace dc
