#pragma once
// Per-group top-B on the device (mirrors cpu/topk.hpp; same rows, same order).
//
// Three steps on ctx.stream():
//   1. one thread per row builds the sort key math::topk_sort_key(score', position), where
//      score' = score, or score + Gumbel noise from cuRAND's Philox: curand_init(seed, row,
//      4 * stream, &s); curand_uniform(&s), clamped below 1 and transformed by the same
//      math::gumbel_from_uniform as the host (math/philox.hpp reproduces those bits exactly);
//   2. cub::DeviceSegmentedSort::StableSortPairsDescending sorts (key, row) within each group;
//   3. the first min(B, n_g) rows of each group are copied out.
// The key already orders ties by position, and the stable sort keeps equal keys in ascending
// row order, which is the host's last tie-break; so the order does not rely on rows being in
// position order.
//
// Layouts as on the CPU: scores, positions: DEVICE [rows]; group_offsets: HOST [groups + 1];
// out: DEVICE [sample_offsets(group_offsets, budget).back()], group after group, each in pick
// order (GroupSamples layout, math/plackett_luce.hpp). Scratch comes from ctx.workspace().
//
// NaN scores are rejected like on the CPU: step 1 records the first NaN row and the op waits for
// the stream once, at the end, to read it. The other checks run on the host before any launch.
// A call with nothing to pick (no rows, or budget 0) launches nothing and so never reads the
// scores (the CPU still rejects a NaN there).
//
// curand_kernel.h is included for curand_init itself; it also brings cuRAND's XORWOW / MRG32k3a
// tables into each translation unit that includes this header (~200 KB of host bss), cuRAND's
// usual cost. math::curand_philox_uniform computes the same bits without it.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <cub/device/device_segmented_sort.cuh>
#include <cuda_runtime.h>
#include <curand_kernel.h>

#include "../core/error.hpp"
#include "../math/philox.hpp"
#include "../math/plackett_luce.hpp"
#include "buffer.cuh"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"
#include "copy.cuh"

namespace dc {
namespace cuda_detail {

// keys[r], row_ids[r] = r for every row; first_nan = min(first_nan, r) for a NaN score.
// The kernels are templates (on their block size) so the header links into several translation
// units of one program: instantiations are COMDAT, a plain __global__ would be defined in each.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    topk_keys_kernel(const float* DC_RESTRICT scores, const std::int32_t* DC_RESTRICT positions,
                     std::int64_t rows, bool noisy, unsigned long long seed,
                     unsigned long long offset, std::uint64_t* DC_RESTRICT keys,
                     std::int32_t* DC_RESTRICT row_ids, unsigned* first_nan) {
  const std::int64_t stride = std::int64_t(gridDim.x) * THREADS;
  for (std::int64_t r = std::int64_t(blockIdx.x) * THREADS + threadIdx.x; r < rows; r += stride) {
    float s = scores[r];
    if (isnan(s)) atomicMin(first_nan, unsigned(r));
    if (noisy) {
      curandStatePhilox4_32_10_t state;
      curand_init(seed, static_cast<unsigned long long>(r), offset, &state);
      const float u = math::clamp_below_one(curand_uniform(&state));
      s = math::perturbed_score(s, math::gumbel_from_uniform(u));
    }
    keys[r] = math::topk_sort_key(s, positions[r]);
    row_ids[r] = std::int32_t(r);
  }
}

// out[out_off[g] + j] = sorted_rows[seg[g] + j] for j < out_off[g + 1] - out_off[g].
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    topk_gather_kernel(const std::int32_t* DC_RESTRICT sorted_rows,
                       const std::int32_t* DC_RESTRICT seg, const std::int32_t* DC_RESTRICT out_off,
                       int groups, std::int32_t* DC_RESTRICT out) {
  for (int g = int(blockIdx.x); g < groups; g += int(gridDim.x)) {
    const std::int32_t begin = seg[g], dst = out_off[g], picks = out_off[g + 1] - dst;
    for (std::int32_t j = std::int32_t(threadIdx.x); j < picks; j += THREADS)
      out[dst + j] = sorted_rows[begin + j];
  }
}

inline std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace cuda_detail

// Writes each group's min(budget, n_g) picks into out (device, layout above).
inline void topk_groups(const Context<cuda>& ctx, const float* scores,
                        const std::int32_t* positions,
                        std::span<const std::int32_t> group_offsets, int budget,
                        std::optional<GumbelNoise> noise, std::int32_t* out) {
  DC_CHECK(budget >= 0, "topk_groups: negative budget ", budget);
  DC_CHECK(!group_offsets.empty() && group_offsets.back() >= 0,
           "topk_groups: group_offsets needs groups + 1 entries ending at the row count");
  const std::int32_t rows = group_offsets.back();
  check_group_offsets(group_offsets, std::size_t(rows), "topk_groups");
  const std::vector<std::int32_t> out_offsets = sample_offsets(group_offsets, budget);
  if (out_offsets.back() == 0) return;  // no picks (no rows, or budget 0): nothing to launch
  DC_CHECK(scores && positions && out, "topk_groups: null device pointer (scores ", scores,
           ", positions ", positions, ", out ", out, ")");
  const int groups = int(group_offsets.size()) - 1;
  const auto n = std::size_t(rows), offsets_count = group_offsets.size();

  // CUB's temp size for this shape (a size query reads no data; the template arguments match
  // the real call below, so the two calls agree on the size).
  std::size_t cub_bytes = 0;
  DC_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairsDescending(
      nullptr, cub_bytes, static_cast<const std::uint64_t*>(nullptr),
      static_cast<std::uint64_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), std::int64_t(n), std::int64_t(groups),
      static_cast<const std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      ctx.stream()));

  // Workspace: keys in/out [rows] u64, rows in/out [rows] i32, group and output offsets
  // [groups + 1] i32, the first NaN row (u32), CUB's temp; each 256-byte aligned.
  using cuda_detail::align_up;
  const std::size_t keys_bytes = align_up(n * sizeof(std::uint64_t));
  const std::size_t rows_bytes = align_up(n * sizeof(std::int32_t));
  const std::size_t offs_bytes = align_up(offsets_count * sizeof(std::int32_t));
  const std::size_t flag_bytes = align_up(sizeof(unsigned));
  auto* base = static_cast<unsigned char*>(
      ctx.workspace(2 * keys_bytes + 2 * rows_bytes + 2 * offs_bytes + flag_bytes + cub_bytes));
  auto* keys_in = reinterpret_cast<std::uint64_t*>(base);
  auto* keys_out = reinterpret_cast<std::uint64_t*>(base + keys_bytes);
  auto* rows_in = reinterpret_cast<std::int32_t*>(base + 2 * keys_bytes);
  auto* rows_out = reinterpret_cast<std::int32_t*>(base + 2 * keys_bytes + rows_bytes);
  unsigned char* tail = base + 2 * keys_bytes + 2 * rows_bytes;
  auto* seg = reinterpret_cast<std::int32_t*>(tail);
  auto* out_off = reinterpret_cast<std::int32_t*>(tail + offs_bytes);
  auto* first_nan = reinterpret_cast<unsigned*>(tail + 2 * offs_bytes);
  void* cub_temp = tail + 2 * offs_bytes + flag_bytes;

  copy_to_backend(ctx, seg, group_offsets.data(), offsets_count);
  copy_to_backend(ctx, out_off, out_offsets.data(), offsets_count);
  DC_CUDA_CHECK(cudaMemsetAsync(first_nan, 0xff, sizeof(unsigned), ctx.stream()));  // none yet

  constexpr int kThreads = 256;
  const unsigned grid = cuda_detail::grid_for(rows, kThreads, 8 * ctx.sm_count());
  cuda_detail::topk_keys_kernel<kThreads><<<grid, kThreads, 0, ctx.stream()>>>(
      scores, positions, std::int64_t(rows), noise.has_value(), noise ? noise->seed : 0,
      noise ? math::gumbel_stream_offset(noise->stream) : 0, keys_in, rows_in, first_nan);
  DC_CUDA_CHECK_LAUNCH("topk_keys_kernel");

  DC_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairsDescending(
      cub_temp, cub_bytes, keys_in, keys_out, rows_in, rows_out, std::int64_t(n),
      std::int64_t(groups), static_cast<const std::int32_t*>(seg),
      static_cast<const std::int32_t*>(seg + 1), ctx.stream()));

  const unsigned gather_grid = unsigned(groups < 65535 ? groups : 65535);
  cuda_detail::topk_gather_kernel<kThreads><<<gather_grid, kThreads, 0, ctx.stream()>>>(
      rows_out, seg, out_off, groups, out);
  DC_CUDA_CHECK_LAUNCH("topk_gather_kernel");

  unsigned nan_row = UINT_MAX;
  copy_to_host(ctx, &nan_row, first_nan, 1);  // waits for the stream
  DC_CHECK(nan_row == UINT_MAX, "topk_groups: score of row ", nan_row, " is NaN");
}

// The same, returning the picks on the host (GroupSamples; waits for the stream).
inline GroupSamples topk_groups(const Context<cuda>& ctx, const float* scores,
                                const std::int32_t* positions,
                                std::span<const std::int32_t> group_offsets, int budget,
                                std::optional<GumbelNoise> noise = std::nullopt) {
  DC_CHECK(budget >= 0, "topk_groups: negative budget ", budget);
  DC_CHECK(!group_offsets.empty() && group_offsets.back() >= 0,
           "topk_groups: group_offsets needs groups + 1 entries ending at the row count");
  check_group_offsets(group_offsets, std::size_t(group_offsets.back()), "topk_groups");
  GroupSamples result;
  result.offsets = sample_offsets(group_offsets, budget);
  result.rows.resize(std::size_t(result.offsets.back()));
  if (result.rows.empty()) return result;
  Buffer<std::int32_t, cuda> picks(result.rows.size());
  topk_groups(ctx, scores, positions, group_offsets, budget, noise, picks.data());
  copy_to_host(ctx, result.rows.data(), picks.data(), result.rows.size());
  return result;
}

}  // namespace dc
