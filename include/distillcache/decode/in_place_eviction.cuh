#pragma once
// Eviction where the cache lives, for a policy whose scores are a ScoreRule (policy/policy.hpp):
// on the GPU the statistics never leave the device (in_place_eviction.hpp says when the decoder
// takes this path; the CPU overload there declines, the CPU's ordinary path being in place
// already). In decode/ rather than cuda/ because it works on a KVCache (cuda/ sits below cache/).
//
// Why: the ordinary path copies every statistics row of every (layer, KV head) to the host,
// forms the features there, scores, selects and sends the keep-sets back. At Mistral-7B's shape,
// 25 % of a 32k context (8192 + 128 slots of 256 groups), one decode-time eviction took 44.6 ms
// on an H200 machine (gathering 19.8, scoring 3.9, selecting 2.6, compacting 18.2): 348 us per
// token at the default chunk of 128, where the throughput issue asks for 20.
//
// Steps, all on ctx.stream():
//  1. per layer, one thread per (KV head, slot): the rule's score and the slot's position into
//     rows [groups, len] (group g = layer * kv_heads + head, the order of features' groups);
//  2. topk_groups (cuda/topk.cuh): each group's top `budget` rows by math::topk_sort_key
//     (score, then the older position), the order select_keep_groups applies on the host, whose
//     sets these therefore are; NaN scores are refused there as on the host;
//  3. each group's picks sorted ascending (cub segmented sort), then turned into slots and
//     their positions;
//  4. every layer compacted from those device keep-sets (cuda/kv.cuh's moves, every slot from 0
//     on), and the positions written on the device and copied once to the host mirror
//     (KVCache::set_positions_from_backend).
// What the host path checks and this one does not: finiteness of the features it never forms
// (an infinite accumulated mass is scored as such).
#include <cstdint>
#include <vector>

#include <cub/device/device_segmented_sort.cuh>
#include <cuda_runtime.h>

#include "../cache/kv_cache.hpp"
#include "../cuda/check.cuh"
#include "../cuda/common.cuh"
#include "../cuda/context.cuh"
#include "../cuda/copy.cuh"
#include "../cuda/kv.cuh"
#include "../cuda/topk.cuh"
#include "../math/features.hpp"
#include "in_place_eviction.hpp"

namespace dc {
namespace cuda_detail {

// Step 1 for one layer (blockIdx.y = KV head h): rows h * len + j of this layer's part.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    rule_scores_kernel(const float* DC_RESTRICT stats, const std::int32_t* DC_RESTRICT key_pos, int len,
                       int capacity, int rows_per_head, int latest_position, int recent,
                       float* DC_RESTRICT scores, std::int32_t* DC_RESTRICT positions) {
  const int j = int(blockIdx.x) * THREADS + int(threadIdx.x);
  const int h = int(blockIdx.y);
  if (j >= len) return;
  const std::int64_t cap = capacity;
  const std::int32_t position = key_pos[h * cap + j];
  const float mass = stats[(std::int64_t(h) * rows_per_head + kStatMass) * cap + j];
  const std::int64_t row = std::int64_t(h) * len + j;
  scores[row] = math::h2o_score(position, latest_position, recent, mass);  // as H2OPolicy's
  positions[row] = position;
}

// Step 3's second half: picks (rows of group g, ascending) -> slots and their positions.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    picks_to_slots_kernel(const std::int32_t* DC_RESTRICT picks, const std::int32_t* DC_RESTRICT row_positions,
                          std::int64_t count, int budget, int len, std::int32_t* DC_RESTRICT slots,
                          std::int32_t* DC_RESTRICT kept_positions) {
  const std::int64_t stride = std::int64_t(gridDim.x) * THREADS;
  for (std::int64_t i = std::int64_t(blockIdx.x) * THREADS + threadIdx.x; i < count; i += stride) {
    const std::int32_t row = picks[i];
    const std::int64_t group = i / budget;
    slots[i] = std::int32_t(row - group * len);
    kept_positions[i] = row_positions[row];
  }
}

// Grows b to at least n elements (its contents are not kept).
template <class T>
void reserve(Buffer<T, cuda>& b, std::size_t n) {
  if (b.size() < n) b = Buffer<T, cuda>(n);
}

}  // namespace cuda_detail

// Evicts every layer of `cache` back to `budget` slots per KV head by `rule`, on the device.
// Returns false, having done nothing, where this path does not apply (see
// decode/in_place_eviction.hpp): a layer not evictable, layers of different lengths, or nothing
// to evict. The keep-sets are exactly select_keep_groups' for the rule's scores.
inline bool evict_in_place(const Context<cuda>& ctx, KVCache<cuda>& cache, const ScoreRule& rule, int budget,
                           InPlaceEvictionScratch<cuda>& scratch) {
  const int layers = cache.num_layers(), kv_heads = cache.num_kv_heads();
  const int len = cache.length(0);
  if (budget <= 0 || len <= budget) return false;
  for (int l = 0; l < layers; ++l)
    if (!cache.evictable(l) || cache.length(l) != len) return false;
  const int groups = layers * kv_heads;
  const std::int64_t rows = std::int64_t(groups) * len, kept = std::int64_t(groups) * budget;
  if (rows > std::int64_t(INT32_MAX)) return false;  // topk_groups indexes rows with int32

  using namespace cuda_detail;
  reserve(scratch.scores, std::size_t(rows));
  reserve(scratch.positions, std::size_t(rows));
  reserve(scratch.picks, std::size_t(kept));
  reserve(scratch.sorted, std::size_t(kept));
  reserve(scratch.slots, std::size_t(kept));
  reserve(scratch.kept_positions, std::size_t(kept));
  reserve(scratch.offsets, std::size_t(groups) + 1);

  // 1. Scores and positions, [groups, len].
  const int latest_position = cache.next_position() - 1;  // TokenFeatures::latest_position
  constexpr int kThreads = 256;
  for (int l = 0; l < layers; ++l) {
    const std::int64_t at = std::int64_t(l) * kv_heads * len;
    const dim3 grid(unsigned(ceil_div(len, kThreads)), unsigned(kv_heads));
    rule_scores_kernel<kThreads><<<grid, kThreads, 0, ctx.stream()>>>(
        cache.stats(l), cache.positions(l), len, cache.capacity(l), cache.stat_rows(), latest_position, rule.recent,
        scratch.scores.data() + at, scratch.positions.data() + at);
    DC_CUDA_CHECK_LAUNCH("rule_scores_kernel");
  }

  // 2. Each group's top `budget` rows, group after group (every group has len > budget rows).
  std::vector<std::int32_t> offsets(std::size_t(groups) + 1);
  for (int g = 0; g <= groups; ++g) offsets[std::size_t(g)] = std::int32_t(std::int64_t(g) * len);
  topk_groups(ctx, scratch.scores.data(), scratch.positions.data(), offsets, budget, std::nullopt,
              scratch.picks.data());

  // 3. Ascending within each group, then slots and positions.
  for (int g = 0; g <= groups; ++g) offsets[std::size_t(g)] = std::int32_t(std::int64_t(g) * budget);
  copy_to_backend(ctx, scratch.offsets.data(), offsets.data(), offsets.size());
  const std::int32_t* begins = scratch.offsets.data();
  std::size_t cub_bytes = 0;
  DC_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeys(nullptr, cub_bytes, scratch.picks.data(), scratch.sorted.data(),
                                                   kept, std::int64_t(groups), begins, begins + 1, ctx.stream()));
  DC_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeys(ctx.workspace(cub_bytes), cub_bytes, scratch.picks.data(),
                                                   scratch.sorted.data(), kept, std::int64_t(groups), begins,
                                                   begins + 1, ctx.stream()));
  picks_to_slots_kernel<kThreads><<<grid_for(kept, kThreads, 8 * ctx.sm_count()), kThreads, 0, ctx.stream()>>>(
      scratch.sorted.data(), scratch.positions.data(), kept, budget, len, scratch.slots.data(),
      scratch.kept_positions.data());
  DC_CUDA_CHECK_LAUNCH("picks_to_slots_kernel");

  // 4. The moves, layer by layer, then the positions.
  for (int l = 0; l < layers; ++l) {
    const std::int32_t* layer_slots = scratch.slots.data() + std::int64_t(l) * kv_heads * budget;
    cache.with_kv(l, [&](auto* k, auto* v) {
      kv_compact_from_device(ctx, k, v, cache.stats(l), kv_heads, cache.head_dim(), cache.stat_rows(),
                             cache.capacity(l), layer_slots, budget);
    });
  }
  cache.set_positions_from_backend(ctx, scratch.kept_positions.data(), budget);
  return true;
}

}  // namespace dc
