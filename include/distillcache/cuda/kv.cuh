#pragma once
// CUDA KV-cache writes and compaction (mirrors cpu/kv.hpp).
//
// Compaction keeps, per KV head h, the slots keep[h*count] < keep[h*count + 1] < ... of its K/V
// rows and its statistics rows [rows, capacity], moved to the front in that order.
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
// Slots before the first evicted one of any head (keep[h*count + i] == i for every head) do not
// move and are skipped, so truncating keep-sets (and the identity) copy nothing.
//
// keep is a HOST span. Its moving part is copied into the workspace with copy_to_backend: from
// pageable memory cudaMemcpyAsync returns once the data is staged, and from pinned memory
// copy_to_backend waits for the stream, so the caller may free or reuse keep as soon as this
// returns. The kernels themselves stay queued on ctx.stream(), in order with everything else.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "../core/error.hpp"
#include "../math/attention_shape.hpp"
#include "../math/features.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"
#include "copy.cuh"

namespace dc {
namespace cuda_detail {

inline constexpr std::size_t kCompactBatchBytes = std::size_t(64) << 20;

// KV is the cache's storage type (float, or bf16 rounded to nearest even as on the CPU).
template <class KV>
__global__ void kv_write_kernel(KV* DC_RESTRICT k_cache, KV* DC_RESTRICT v_cache,
                                const float* DC_RESTRICT k, const float* DC_RESTRICT v,
                                std::int64_t count, int first, int kv_heads, int head_dim,
                                int capacity) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t begin = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t e = begin; e < count; e += stride) {
    // e indexes the source [n, kv_heads, head_dim]: coalesced reads, per-head contiguous writes.
    const int i = int(e % head_dim);
    const std::int64_t th = e / head_dim;
    const int h = int(th % kv_heads);
    const std::int64_t t = th / kv_heads;
    const std::int64_t dst = (std::int64_t(h) * capacity + first + t) * head_dim + i;
    store_float(k_cache + dst, k[e]);
    store_float(v_cache + dst, v[e]);
  }
}

// Statistics of the new slots: one warp per (token t, KV head h) (WARPS per block, so a decode
// step's one token spreads over the heads). Zeroes every row of slot first + t of head h and
// records the L2 norms of that head's k and v rows. Reads the chunk's fp32 k/v (not the cache),
// so it needs no ordering with kv_write_kernel and the norms do not depend on the storage type
// (as on the CPU).
template <int WARPS>
__global__ void __launch_bounds__(WARPS * kWarpSize)
    kv_write_stats_kernel(float* DC_RESTRICT stats, const float* DC_RESTRICT k,
                          const float* DC_RESTRICT v, int n, int first, int kv_heads, int head_dim,
                          int capacity, int rows) {
  const std::int64_t task = std::int64_t(blockIdx.x) * WARPS + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (task >= std::int64_t(n) * kv_heads) return;  // warp-uniform
  const int t = int(task / kv_heads), h = int(task % kv_heads);
  const std::int64_t slot = std::int64_t(first) + t;
  const std::int64_t src = (std::int64_t(t) * kv_heads + h) * head_dim;
  float kk = 0.0f, vv = 0.0f;
  for (int i = lane; i < head_dim; i += kWarpSize) {
    kk = fmaf(k[src + i], k[src + i], kk);
    vv = fmaf(v[src + i], v[src + i], vv);
  }
  const float key_norm = sqrtf(warp_sum(kk));  // every lane holds the sums
  const float value_norm = sqrtf(warp_sum(vv));
  float* head_rows = stats + std::int64_t(h) * rows * capacity;
  for (int r = lane; r < rows; r += kWarpSize) {
    const float value = r == kStatKeyNorm ? key_norm : r == kStatValueNorm ? value_norm : 0.0f;
    head_rows[std::int64_t(r) * capacity + slot] = value;
  }
}

// Bytes of scratch one destination slot needs: its K and V rows (storage type KV) and its
// statistics rows (fp32), for every KV head.
template <class KV>
constexpr std::size_t compact_row_bytes(int kv_heads, int head_dim, int rows) {
  return std::size_t(kv_heads) * (std::size_t(2) * head_dim * sizeof(KV) + std::size_t(rows) * sizeof(float));
}

// Moves a batch of `count` destinations of every KV head between the cache (destination slots
// first..first+count, or source slots src_slot[h * src_stride + i]) and the scratch:
// K [kv_heads, count, head_dim] and V (both KV), then statistics [kv_heads, rows, count] (fp32;
// 4-byte aligned after the K/V part, whose element count is even). Bits are moved, not values.
// kGather: cache[src slot] -> scratch[i]; else scratch[i] -> cache[first + i].
template <class KV, bool kGather>
__global__ void kv_compact_kernel(KV* DC_RESTRICT k_cache, KV* DC_RESTRICT v_cache,
                                  float* DC_RESTRICT stats, void* DC_RESTRICT scratch,
                                  const std::int32_t* DC_RESTRICT src_slot, int src_stride,
                                  int count, int first, int kv_heads, int head_dim, int rows,
                                  int capacity) {
  const std::int64_t kv_count = std::int64_t(kv_heads) * count * head_dim;
  const std::int64_t total = 2 * kv_count + std::int64_t(kv_heads) * rows * count;
  KV* const scratch_k = static_cast<KV*>(scratch);
  KV* const scratch_v = scratch_k + kv_count;
  float* const scratch_s = reinterpret_cast<float*>(scratch_v + kv_count);
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
      const int slot = kGather ? src_slot[h * src_stride + i] : first + i;
      KV* cache = is_v ? v_cache : k_cache;
      KV* buf = is_v ? scratch_v : scratch_k;
      const std::int64_t c = (h * capacity + slot) * head_dim + d;
      if constexpr (kGather) buf[f] = cache[c];
      else cache[c] = buf[f];
    } else {
      const std::int64_t f = e - 2 * kv_count;  // [kv_heads, rows, count]
      const int i = int(f % count);
      const std::int64_t hr = f / count;  // h * rows + r
      const std::int64_t h = hr / rows;
      const std::int64_t c = hr * capacity + (kGather ? src_slot[h * src_stride + i] : first + i);
      if constexpr (kGather) scratch_s[f] = stats[c];
      else stats[c] = scratch_s[f];
    }
  }
}

// Destinations per gather/scatter batch: the scratch holds kCompactBatchBytes at most.
template <class KV>
std::size_t compact_batch(int kv_heads, int head_dim, int rows_of_stats, int moving) {
  std::size_t batch = kCompactBatchBytes / compact_row_bytes<KV>(kv_heads, head_dim, rows_of_stats);
  if (batch < 1) batch = 1;
  if (batch > std::size_t(moving)) batch = std::size_t(moving);
  return batch;
}

// The moves of a compaction: destinations fixed + i (i < moving) of head h take source slot
// src_slots[h * src_stride + i] (device), gathered into scratch (batch destinations at a time)
// and scattered back, batches in ascending order (the header comment says why that is
// race-free).
template <class KV>
void compact_moves(const Context<cuda>& ctx, KV* k_cache, KV* v_cache, float* stats, int kv_heads, int head_dim,
                   int rows_of_stats, int capacity, const std::int32_t* src_slots, int src_stride, int moving,
                   int fixed, void* scratch, std::size_t batch) {
  constexpr int kThreads = 256;
  for (int a = 0; a < moving; a += int(batch)) {
    const int cnt = moving - a < int(batch) ? moving - a : int(batch);
    // One thread per moved element (K/V values and statistics alike).
    const std::int64_t elems =
        std::int64_t(cnt) * kv_heads * (std::int64_t(2) * head_dim + std::int64_t(rows_of_stats));
    const unsigned grid = grid_for(elems, kThreads, 8 * ctx.sm_count());
    kv_compact_kernel<KV, true><<<grid, kThreads, 0, ctx.stream()>>>(
        k_cache, v_cache, stats, scratch, src_slots + a, src_stride, cnt, fixed + a, kv_heads,
        head_dim, rows_of_stats, capacity);
    DC_CUDA_CHECK_LAUNCH("kv_compact_kernel<gather>");
    kv_compact_kernel<KV, false><<<grid, kThreads, 0, ctx.stream()>>>(
        k_cache, v_cache, stats, scratch, src_slots + a, src_stride, cnt, fixed + a, kv_heads,
        head_dim, rows_of_stats, capacity);
    DC_CUDA_CHECK_LAUNCH("kv_compact_kernel<scatter>");
  }
}

}  // namespace cuda_detail

// Writes the chunk's k/v rows [n, kv_heads*head_dim] into cache slots [first, first + n),
// stored as KV (float, or bf16 rounded to nearest even) and, with a statistics block (device,
// [kv_heads, rows, capacity]), resets the new slots' accumulators and records each KV head's K/V
// norms (of the fp32 rows), as the CPU overload.
template <class KV>
void kv_write(const Context<cuda>& ctx, KV* k_cache, KV* v_cache, const float* k, const float* v,
              int n, int first, const AttentionShape& s, float* stats = nullptr) {
  if (n <= 0) return;
  DC_CHECK(first >= 0 && first + n <= s.capacity, "kv_write of slots [", first, ", ", first + n,
           ") outside capacity ", s.capacity);
  const std::int64_t count = std::int64_t(n) * s.num_kv_heads * s.head_dim;
  constexpr int kThreads = 256;
  const unsigned grid = cuda_detail::grid_for(count, kThreads, 8 * ctx.sm_count());
  cuda_detail::kv_write_kernel<KV><<<grid, kThreads, 0, ctx.stream()>>>(
      k_cache, v_cache, k, v, count, first, s.num_kv_heads, s.head_dim, s.capacity);
  DC_CUDA_CHECK_LAUNCH("kv_write_kernel");
  if (!stats) return;
  constexpr int kWarps = 4;
  cuda_detail::kv_write_stats_kernel<kWarps><<<unsigned(cuda_detail::ceil_div(std::int64_t(n) * s.num_kv_heads, kWarps)),
                                               kWarps * cuda_detail::kWarpSize, 0, ctx.stream()>>>(
      stats, k, v, n, first, s.num_kv_heads, s.head_dim, s.capacity,
      stat_rows_per_kv_head(s.num_heads / s.num_kv_heads));
  DC_CUDA_CHECK_LAUNCH("kv_write_stats_kernel");
}

// Per-head compaction: KV head h keeps slots keep[h*count] < ... (host span [kv_heads, count],
// strictly ascending per head, each < capacity) of k_cache/v_cache [kv_heads, capacity, head_dim]
// (storage type KV: float or bf16) and of its rows_of_stats rows of stats
// [kv_heads, rows_of_stats, capacity] (device pointers; stats may be null). Slots past count keep
// stale data, as on the CPU.
template <class KV>
void kv_compact(const Context<cuda>& ctx, KV* k_cache, KV* v_cache, float* stats, int kv_heads,
                int head_dim, int rows_of_stats, int capacity, std::span<const std::int32_t> keep,
                int count) {
  DC_CHECK(count >= 0 && count <= capacity && keep.size() == std::size_t(kv_heads) * count,
           "kv_compact: ", keep.size(), " keep entries for ", kv_heads, " kv heads of ", count,
           " slots (capacity ", capacity, ")");
  int fixed = count;  // keep[h*count + i] == i for every head and i < fixed: rows that stay put
  for (int h = 0; h < kv_heads; ++h) {
    const std::int32_t* head_keep = keep.data() + std::size_t(h) * count;
    int head_fixed = 0;
    for (int i = 0; i < count; ++i) {
      const std::int32_t slot = head_keep[i];
      DC_CHECK(slot >= 0 && slot < capacity, "kv_compact: slot ", slot, " outside [0, ", capacity,
               ")");
      DC_CHECK(i == 0 || slot > head_keep[i - 1], "kv_compact: keep-set of kv head ", h,
               " must be strictly ascending");
      if (slot == i && head_fixed == i) head_fixed = i + 1;
    }
    if (head_fixed < fixed) fixed = head_fixed;
  }
  const int moving = count - fixed;
  if (moving == 0) return;
  if (!stats) rows_of_stats = 0;

  using namespace cuda_detail;
  const std::size_t batch = compact_batch<KV>(kv_heads, head_dim, rows_of_stats, moving);
  // One workspace request: the source slots [kv_heads, moving] (int32, padded to 16 bytes), then
  // the scratch.
  const std::size_t slot_count = std::size_t(kv_heads) * moving;
  const std::size_t slot_floats = (slot_count + 3) / 4 * 4;
  const std::size_t row_bytes = compact_row_bytes<KV>(kv_heads, head_dim, rows_of_stats);
  float* ws = ctx.workspace_as<float>(slot_floats + (batch * row_bytes + sizeof(float) - 1) / sizeof(float));
  auto* src_slots = reinterpret_cast<std::int32_t*>(ws);
  std::vector<std::int32_t> moving_slots(slot_count);
  for (int h = 0; h < kv_heads; ++h)
    for (int i = 0; i < moving; ++i)
      moving_slots[std::size_t(h) * moving + i] = keep[std::size_t(h) * count + fixed + i];
  copy_to_backend(ctx, src_slots, moving_slots.data(), slot_count);
  compact_moves(ctx, k_cache, v_cache, stats, kv_heads, head_dim, rows_of_stats, capacity, src_slots, moving,
                moving, fixed, ws + slot_floats, batch);
}

// kv_compact for a keep-set already on the device (decode/in_place_eviction.cuh): head h keeps slots
// keep[h * count + i], i < count (device, [kv_heads, count], strictly ascending per head: the
// caller's guarantee, not checked here), moved to the front. Every slot moves, from 0 on.
template <class KV>
void kv_compact_from_device(const Context<cuda>& ctx, KV* k_cache, KV* v_cache, float* stats, int kv_heads,
                            int head_dim, int rows_of_stats, int capacity, const std::int32_t* keep,
                            int count) {
  DC_CHECK(count >= 0 && count <= capacity, "kv_compact_from_device: ", count, " slots (capacity ",
           capacity, ")");
  if (count == 0) return;
  if (!stats) rows_of_stats = 0;
  using namespace cuda_detail;
  const std::size_t batch = compact_batch<KV>(kv_heads, head_dim, rows_of_stats, count);
  const std::size_t row_bytes = compact_row_bytes<KV>(kv_heads, head_dim, rows_of_stats);
  void* scratch = ctx.workspace_as<float>((batch * row_bytes + sizeof(float) - 1) / sizeof(float));
  compact_moves(ctx, k_cache, v_cache, stats, kv_heads, head_dim, rows_of_stats, capacity, keep, count, count,
                0, scratch, batch);
}

}  // namespace dc
