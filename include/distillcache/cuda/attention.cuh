#pragma once
// CUDA grouped-query attention (mirrors cpu/attention.hpp; the cache's writes and compaction
// are in cuda/kv.cuh).
//
// Layout: K/V caches are [kv_heads, capacity, head_dim], positions [kv_heads, capacity]; slots
// [0, len) of every KV head are valid and slot j of head g holds the token at position
// key_pos[g * capacity + j] (each KV head may hold its own keep-set). Query t (at query_pos[t])
// sees that slot iff math::attends(query_pos[t], key_pos[g * capacity + j], window): masks follow
// positions, so one kernel serves prefill, decode, sliding windows and compacted (evicted)
// caches, whose positions have gaps.
//
// Two main kernels: one query per sequence (a decode step) takes decode_attention_kernel
// (cuda/attention_decode.cuh: K/V straight into registers, every load serving the whole GQA
// group) where it applies; everything else (prefill chunks, padded head dims, unaligned caches)
// takes the tiled kernel described here. Both write the same split partials and statistics
// scratch, so the split combine and the statistics fold below serve both.
//
// Algorithm of the tiled kernel (why this one): a single pass with an online softmax over key tiles, split along the
// keys when there are too few blocks to fill the GPU (flash-decoding), then a small combine
// kernel. Shared memory holds one tile of K and V whatever len is, so len is bounded only by
// memory (32k+ is routine), and K/V are read once per block instead of twice as a two-pass
// scheme with global score scratch would. The block/warp mapping:
//   - a block owns one KV head and ROWS "query rows" (query t, query head h of that KV head's
//     group), one warp per row: the heads of a GQA group share every K/V tile a block loads
//     (decode of Mistral-7B: the 4 heads of a group are the 4 warps of one block);
//   - per tile of 32 keys, lane l scores key l (a dot product over head_dim against the warp's
//     query in shared memory), the warp takes the tile max, rescales its running state, and
//     then each lane accumulates its slice of head_dim over the 32 keys (probabilities are
//     broadcast by shuffle);
//   - a tile no row of the block can see (future keys during prefill, keys outside a sliding
//     window) is skipped before its K/V are loaded, so windows cost only the keys they see.
// head_dim is a compile-time constant (64, 128) or padded up to 64/128/256 with zeros (generic
// fallback), so the inner loops are fully unrolled; DC_DISPATCH_HEAD_DIM picks the variant.
// K/V are stored as KV (float, or bf16: half the bytes a long-context decode step reads); a tile
// is widened to fp32 as it is staged in shared memory, so everything after the load is the same
// code for both (the CPU widens each bf16 element the same way: exactly).
//
// Statistics (AttentionStats, math/features.hpp), fused without a second pass over K or V:
//   - an observed row (t >= first_observed) also keeps sum_j e^(s_j - m) (s_j - m) next to its
//     running sum, rescaled like it when the max moves, and stores each visible key's raw scaled
//     score s_j in workspace scores[observed, heads, len] (len floats per row: the only extra
//     traffic of an observed decode step);
//   - its final state (max m, 1/Z, entropy H = log Z - E_p[s - m]) goes to workspace row_state,
//     from the main kernel (one split) or from the split combine;
//   - attention_stats_kernel, one thread per (KV head g, slot j), turns the scores into the final
//     p = e^(s_j - m) / Z and folds them into that head's rows of the slot in the CPU's fixed
//     order (observed query t, then the group's head h), so the sums are deterministic and match
//     cpu/attention.hpp to rounding. It reads only the score scratch, never K or V.
// Every kernel here is a template (instantiations are COMDAT), so the header links into several
// translation units of one program; a plain __global__ function would be defined in each.
// The score scratch is observed*heads*len floats (prefill chunk of 64 observed queries, 32 heads
// and 32k keys: 256 MiB of workspace), as the CPU keeps the same probabilities.
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "../math/attention_rules.hpp"
#include "../math/attention_shape.hpp"
#include "../math/features.hpp"
#include "../math/softmax.hpp"
#include "attention_decode.cuh"
#include "attention_parts.cuh"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"

// Turns a runtime head_dim into compile-time HEAD_DIM_CAP (the shared-memory row width) and
// PADDED (head_dim < HEAD_DIM_CAP: dims [head_dim, HEAD_DIM_CAP) are zero-filled).
#define DC_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM_CAP, PADDED, ...)                              \
  [&] {                                                                                        \
    if ((head_dim) == 64) {                                                                    \
      constexpr int HEAD_DIM_CAP = 64;                                                         \
      constexpr bool PADDED = false;                                                           \
      return __VA_ARGS__();                                                                    \
    } else if ((head_dim) == 128) {                                                            \
      constexpr int HEAD_DIM_CAP = 128;                                                        \
      constexpr bool PADDED = false;                                                           \
      return __VA_ARGS__();                                                                    \
    } else if ((head_dim) < 64) {                                                              \
      constexpr int HEAD_DIM_CAP = 64;                                                         \
      constexpr bool PADDED = true;                                                            \
      return __VA_ARGS__();                                                                    \
    } else if ((head_dim) < 128) {                                                             \
      constexpr int HEAD_DIM_CAP = 128;                                                        \
      constexpr bool PADDED = true;                                                            \
      return __VA_ARGS__();                                                                    \
    } else if ((head_dim) <= 256) {                                                            \
      constexpr int HEAD_DIM_CAP = 256;                                                        \
      constexpr bool PADDED = true;                                                            \
      return __VA_ARGS__();                                                                    \
    } else {                                                                                   \
      DC_FAIL("CUDA attention supports head_dim up to 256, got ", (head_dim));                 \
    }                                                                                          \
  }()

namespace dc {
namespace cuda_detail {

// Per-lane slice of a head: VEC-wide chunks at dims c*32*VEC + lane*VEC, so a warp reading one
// smem row touches consecutive 16-byte words (no bank conflicts).
template <int HEAD_DIM_CAP>
struct LaneSlice {
  static constexpr int kDims = HEAD_DIM_CAP / kWarpSize;  // dims per lane
  static constexpr int kVec = kDims < 4 ? kDims : 4;
  static constexpr int kChunks = kDims / kVec;
  static __device__ __forceinline__ int dim(int lane, int chunk, int i) {
    return chunk * kWarpSize * kVec + lane * kVec + i;
  }
};

template <int VEC>
__device__ __forceinline__ void load_smem(const float* p, float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    static_assert(VEC == 2, "lane slices are 2 or 4 wide");
    const float2 f = *reinterpret_cast<const float2*>(p);
    v[0] = f.x, v[1] = f.y;
  }
}

// The next K/V tile, loaded into registers while the block computes the current one (exact-width
// variants, whose tile of kTile rows is one contiguous 16-byte aligned run): per thread kLoads
// 16-byte vectors of K and of V at vector indices threadIdx.x + i * kThreads of the tile, rows
// past tile_keys as zeros (never NaN garbage). store() puts them into the fp32 shared-memory
// tiles (row stride kStride; bf16 widened exactly). Why: staging a tile only after the previous
// one is consumed leaves each block one HBM round trip per 32 keys with nothing else to do, which
// held a 32k decode to 0.93 TB/s on an H200.
template <class KV, int HEAD_DIM_CAP, int kStride, int kTile, int kThreads>
struct TilePrefetch {
  static constexpr int kPerVec = 16 / int(sizeof(KV));  // elements per 16-byte vector
  static constexpr int kRowVecs = HEAD_DIM_CAP / kPerVec;
  static constexpr int kLoads = kTile * kRowVecs / kThreads;
  static_assert(kLoads * kThreads == kTile * kRowVecs, "a tile is whole vectors of every thread");
  using Vec = std::conditional_t<std::is_same_v<KV, float>, float4, uint4>;
  Vec k[kLoads], v[kLoads];

  __device__ __forceinline__ void load(const KV* ksrc_row, const KV* vsrc_row, int tile_keys) {
    const Vec* ksrc = reinterpret_cast<const Vec*>(ksrc_row);
    const Vec* vsrc = reinterpret_cast<const Vec*>(vsrc_row);
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = int(threadIdx.x) + i * kThreads;
      if (e / kRowVecs < tile_keys) {
        k[i] = ksrc[e];
        v[i] = vsrc[e];
      } else {
        k[i] = Vec{};
        v[i] = Vec{};
      }
    }
  }
  __device__ __forceinline__ void store(float* ks, float* vs) const {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = int(threadIdx.x) + i * kThreads;
      const int key = e / kRowVecs, c = e % kRowVecs;
      if constexpr (std::is_same_v<KV, float>) {
        *reinterpret_cast<float4*>(ks + key * kStride + 4 * c) = k[i];
        *reinterpret_cast<float4*>(vs + key * kStride + 4 * c) = v[i];
      } else {
        store_widened(ks + key * kStride + 8 * c, k[i]);
        store_widened(vs + key * kStride + 8 * c, v[i]);
      }
    }
  }
};

template <int HEAD_DIM_CAP, int ROWS>
constexpr std::size_t attention_smem_bytes() {
  // K and V tiles with rows padded by 4 floats (keeps float4 alignment, and lane l's row starts
  // 4 banks after lane l-1's, so the score phase's float4 reads are conflict-free), plus the
  // block's queries.
  return (std::size_t(2) * kAttnTileKeys * (HEAD_DIM_CAP + 4) + std::size_t(ROWS) * HEAD_DIM_CAP) *
         sizeof(float);
}

template <class KV, int HEAD_DIM_CAP, bool PADDED, int ROWS>
__global__ void __launch_bounds__(ROWS * kWarpSize) attention_kernel(const AttentionParams<KV> p) {
  constexpr int kStride = HEAD_DIM_CAP + 4;
  constexpr int kTile = kAttnTileKeys;
  using Slice = LaneSlice<HEAD_DIM_CAP>;
  extern __shared__ float4 smem_f4[];  // float4 for 16-byte alignment
  float* ks = reinterpret_cast<float*>(smem_f4);  // [kTile][kStride]
  float* vs = ks + kTile * kStride;               // [kTile][kStride]
  float* qs = vs + kTile * kStride;               // [ROWS][HEAD_DIM_CAP]

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int hd = PADDED ? p.head_dim : HEAD_DIM_CAP;
  // Query heads h with math::kv_head_of(h) == kvh are kvh*group .. kvh*group + group - 1.
  const int row = blockIdx.x * ROWS + warp;
  const bool active = row < p.rows;  // warp-uniform
  const int t = active ? row / p.group : 0;
  const int h = kvh * p.group + (active ? row % p.group : 0);
  const std::int64_t qo_offset = (std::int64_t(t) * p.num_heads + h) * hd;
  // Observed rows keep statistics (warp-uniform).
  const bool observed = active && p.obs_scores != nullptr && t >= p.first_observed;
  const std::int64_t obs_row = std::int64_t(t - p.first_observed) * p.num_heads + h;
  float* const obs_scores = observed ? p.obs_scores + obs_row * p.len : nullptr;

  // Stage the warp's query (zero-padded to HEAD_DIM_CAP).
  for (int i = lane; i < HEAD_DIM_CAP; i += kWarpSize)
    qs[warp * HEAD_DIM_CAP + i] = (active && i < hd) ? p.q[qo_offset + i] : 0.0f;
  const int query_pos = active ? p.query_pos[t] : 0;

  const std::int64_t head_offset = std::int64_t(kvh) * p.capacity * hd;
  const KV* kh = p.k_cache + head_offset;
  const KV* vh = p.v_cache + head_offset;
  const std::int32_t* kp = p.key_pos + std::int64_t(kvh) * p.capacity;
  const int k_begin = split * p.keys_per_split;
  const int k_end = min(p.len, k_begin + p.keys_per_split);

  float m = -INFINITY;  // running max (warp-uniform)
  float l = 0.0f;       // this lane's share of the running sum
  float w = 0.0f;       // this lane's share of sum e^(s - m) (s - m) (observed rows only)
  float o[Slice::kChunks][Slice::kVec] = {};

  // Exact-width variants load each tile one tile ahead (TilePrefetch); `held` is the tile whose
  // K/V the registers hold (-1: none). A key's position is likewise read one tile ahead.
  TilePrefetch<KV, HEAD_DIM_CAP, kStride, kTile, ROWS * kWarpSize> ahead;
  int held = -1;
  int position_ahead = k_begin + lane < k_end ? kp[k_begin + lane] : 0;
  for (int tile = k_begin; tile < k_end; tile += kTile) {
    const int j = tile + lane;
    const int key_position = position_ahead;  // kp[j] where j < k_end
    if (j + kTile < k_end) position_ahead = kp[j + kTile];
    const bool visible = active && j < k_end && math::attends(query_pos, key_position, p.window);
    // Also the barrier that lets the previous tile's readers finish before it is overwritten.
    if (!__syncthreads_or(visible)) continue;

    // Load the K/V tile; slots past k_end read as zero (never NaN garbage).
    const int tile_keys = min(kTile, k_end - tile);
    if constexpr (!PADDED) {
      // Rows are contiguous (stride head_dim == HEAD_DIM_CAP): the tile is one 16-byte run.
      if (held != tile) ahead.load(kh + std::int64_t(tile) * hd, vh + std::int64_t(tile) * hd, tile_keys);
      ahead.store(ks, vs);
      const int following = tile + kTile;  // in flight while this tile is computed
      held = following < k_end ? following : -1;
      if (following < k_end)
        ahead.load(kh + std::int64_t(following) * hd, vh + std::int64_t(following) * hd,
                   min(kTile, k_end - following));
    } else {
      for (int e = threadIdx.x; e < kTile * HEAD_DIM_CAP; e += ROWS * kWarpSize) {
        const int key = e / HEAD_DIM_CAP, i = e % HEAD_DIM_CAP;
        const bool in = key < tile_keys && i < hd;
        const std::int64_t src = std::int64_t(tile + key) * hd + i;
        ks[key * kStride + i] = in ? load_float(kh + src) : 0.0f;
        vs[key * kStride + i] = in ? load_float(vh + src) : 0.0f;
      }
    }
    __syncthreads();

    if (active) {
      // Score phase: lane l scores key `tile + l`.
      float s = -INFINITY;
      if (visible) {
        const float* qrow = qs + warp * HEAD_DIM_CAP;  // same address in all lanes: broadcast
        const float* krow = ks + lane * kStride;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < HEAD_DIM_CAP; i += 4) {
          const float4 a = *reinterpret_cast<const float4*>(qrow + i);
          const float4 b = *reinterpret_cast<const float4*>(krow + i);
          dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        s = dot * p.scale;
        if (observed) obs_scores[j] = s;  // coalesced: lane l writes key tile + l
      }
      const float tile_max = warp_max(s);
      if (tile_max != -INFINITY) {  // warp-uniform: some key of this tile is visible to the row
        const float m_new = fmaxf(m, tile_max);
        const float rescale = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
        const float prob = visible ? expf(s - m_new) : 0.0f;
        if (observed) {
          w = math::rebased_weighted_sum(w, l, m, m_new, rescale);
          if (visible) w = fmaf(prob, s - m_new, w);
        }
        l = l * rescale + prob;
#pragma unroll
        for (int c = 0; c < Slice::kChunks; ++c)
#pragma unroll
          for (int i = 0; i < Slice::kVec; ++i) o[c][i] *= rescale;
        // Value phase: each lane owns a slice of head_dim and walks the tile's keys.
#pragma unroll 8
        for (int key = 0; key < kTile; ++key) {
          const float pk = __shfl_sync(kFullMask, prob, key);
          if (pk == 0.0f) continue;  // masked (warp-uniform), as the CPU loop skips it
          const float* vrow = vs + key * kStride;
#pragma unroll
          for (int c = 0; c < Slice::kChunks; ++c) {
            float v[Slice::kVec];
            load_smem<Slice::kVec>(vrow + Slice::dim(lane, c, 0), v);
#pragma unroll
            for (int i = 0; i < Slice::kVec; ++i) o[c][i] = fmaf(pk, v[i], o[c][i]);
          }
        }
        m = m_new;
      }
    }
  }

  if (!active) return;  // no barriers below
  const float sum = warp_sum(l);
  const float weighted = observed ? warp_sum(w) : 0.0f;  // warp-uniform condition
  if (p.num_splits == 1) {
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // no visible key: zeros, as the CPU
    if (observed && lane == 0) p.obs_state[obs_row] = row_state(m, sum, weighted);
    float* dst = p.out + qo_offset;
#pragma unroll
    for (int c = 0; c < Slice::kChunks; ++c)
#pragma unroll
      for (int i = 0; i < Slice::kVec; ++i) {
        const int d = Slice::dim(lane, c, i);
        if (!PADDED || d < hd) dst[d] = o[c][i] * inv;
      }
  } else {
    const std::int64_t rows_total = std::int64_t(p.n) * p.num_heads;
    const std::int64_t part = split * rows_total + std::int64_t(t) * p.num_heads + h;
    float* dst = p.part_o + part * hd;
#pragma unroll
    for (int c = 0; c < Slice::kChunks; ++c)
#pragma unroll
      for (int i = 0; i < Slice::kVec; ++i) {
        const int d = Slice::dim(lane, c, i);
        if (!PADDED || d < hd) dst[d] = o[c][i];
      }
    if (lane == 0) {
      p.part_ml[part] = make_float2(m, sum);
      if (observed) p.part_w[part] = weighted;
    }
  }
}

// Merges the splits of one (query, head) row: one block per row. Warp 0 combines the splits'
// (max, sum) pairs (each lane a strided subset, then a butterfly; lane 0's result is the row's,
// since fused multiply-adds may round the lanes' copies apart), and writes each split's weight
// e^(m_s - M) / Z once to shared memory (and, with kStats, an observed row's statistics state).
// Then the block sums the splits' partial outputs with those weights: the threads are
// kCombineThreads / (head_dim / VEC) groups, each walking every groups-th split with VEC-wide
// loads, and the groups' sums are added in group order (deterministic). Why not one thread per
// dim walking all splits: that is one dependent HBM round trip per split, 12.5 us per call on an
// H200 at 66 splits (11 % of a 16-sequence decode step).
inline constexpr int kCombineThreads = 256;

template <bool kStats, int VEC>
__global__ void __launch_bounds__(kCombineThreads)
    attention_combine_kernel(float* DC_RESTRICT out, const float* DC_RESTRICT part_o,
                             const float2* DC_RESTRICT part_ml, const float* DC_RESTRICT part_w,
                             float4* DC_RESTRICT obs_state, int first_observed_row, int rows_total,
                             int head_dim, int num_splits) {
  extern __shared__ float4 combine_smem4[];  // float4: 16-byte aligned
  float* split_weight = reinterpret_cast<float*>(combine_smem4);  // [num_splits], padded to 4
  float* group_sums = split_weight + (num_splits + 3) / 4 * 4;     // [groups][head_dim]
  const int row = blockIdx.x;
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    math::OnlineSoftmax total;
    for (int s = lane; s < num_splits; s += kWarpSize) {
      const float2 ml = part_ml[std::int64_t(s) * rows_total + row];
      total.combine(math::OnlineSoftmax{ml.x, ml.y});
    }
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
      total.combine(math::OnlineSoftmax{__shfl_xor_sync(kFullMask, total.max, offset),
                                        __shfl_xor_sync(kFullMask, total.sum, offset)});
    total.max = __shfl_sync(kFullMask, total.max, 0);
    total.sum = __shfl_sync(kFullMask, total.sum, 0);
    const float inv = total.sum > 0.0f ? 1.0f / total.sum : 0.0f;  // no visible key: zeros
    const bool stats_row = kStats && row >= first_observed_row;     // block-uniform
    float weighted = 0.0f;
    for (int s = lane; s < num_splits; s += kWarpSize) {
      const std::int64_t part = std::int64_t(s) * rows_total + row;
      const float2 ml = part_ml[part];
      const float scale = ml.x == -INFINITY ? 0.0f : expf(ml.x - total.max);
      split_weight[s] = scale * inv;
      // Each split's weighted sum is relative to its own max m_s: moved to the total max.
      if (stats_row) weighted += math::rebased_weighted_sum(part_w[part], ml.y, ml.x, total.max, scale);
    }
    if (stats_row) {
      weighted = warp_sum(weighted);
      if (lane == 0) obs_state[row - first_observed_row] = row_state(total.max, total.sum, weighted);
    }
  }
  __syncthreads();
  const int lanes = head_dim / VEC;  // threads per split row (head_dim <= 256)
  const int groups = kCombineThreads / lanes;
  const int group = threadIdx.x / lanes, c = threadIdx.x % lanes;
  if (group < groups) {
    float acc[VEC] = {};
#pragma unroll 4
    for (int s = group; s < num_splits; s += groups) {
      const float* src = part_o + (std::int64_t(s) * rows_total + row) * head_dim + c * VEC;
      const float weight = split_weight[s];
      if constexpr (VEC == 4) {
        const float4 v = *reinterpret_cast<const float4*>(src);
        acc[0] = fmaf(v.x, weight, acc[0]), acc[1] = fmaf(v.y, weight, acc[1]);
        acc[2] = fmaf(v.z, weight, acc[2]), acc[3] = fmaf(v.w, weight, acc[3]);
      } else {
        acc[0] = fmaf(src[0], weight, acc[0]);
      }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) group_sums[group * head_dim + c * VEC + i] = acc[i];
  }
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += kCombineThreads) {
    float sum = 0.0f;
    for (int g = 0; g < groups; ++g) sum += group_sums[g * head_dim + d];
    out[std::int64_t(row) * head_dim + d] = sum;
  }
}

// Folds the observed rows' probabilities into the statistics block: one thread per (KV head g,
// slot j) (blockIdx.y = g), so no two threads touch the same address, and inside a thread the
// order is the CPU's (observed query r, then the group's head h), which makes the sums
// deterministic. Reads scores [observed, heads, len] (coalesced across j) and row_state
// [observed, heads] (a broadcast), never K or V. A key the query does not see contributes p = 0,
// as on the CPU; adding 0 is skipped.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    attention_stats_kernel(float* DC_RESTRICT block, const float* DC_RESTRICT scores,
                                       const float4* DC_RESTRICT state,
                                       const std::int32_t* DC_RESTRICT key_pos,
                                       const std::int32_t* DC_RESTRICT obs_query_pos, int observed,
                                       int num_heads, int group, int len, int capacity, int window) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int g = blockIdx.y;
  if (j >= len) return;
  const std::int64_t cap = capacity;
  const int key = key_pos[std::int64_t(g) * cap + j];
  float* head_block = block + std::int64_t(g) * stat_rows_per_kv_head(group) * cap;
  math::fold_slot_statistics(
      head_block, cap, j, observed, group,
      [&](int r) { return math::attends(obs_query_pos[r], key, window); },
      [&](int r, int h, float& p, float& row_entropy) {
        const std::int64_t row = std::int64_t(r) * num_heads + std::int64_t(g) * group + h;
        const float4 st = state[row];
        p = expf(scores[row * len + j] - st.x) * st.y;
        row_entropy = st.z;
      });
}

// Splits of the keys so that base_blocks * splits fills target blocks, never below
// kAttnMinKeysPerSplit keys a split (its fixed cost would dominate); sets p.keys_per_split (a
// multiple of kAttnTileKeys) and p.num_splits.
template <class KV>
void choose_splits(AttentionParams<KV>& p, int base_blocks, int target) {
  int splits = 1;
  if (base_blocks < target) {
    const int by_occupancy = int(ceil_div(target, base_blocks));
    const int by_length = int(ceil_div(p.len, kAttnMinKeysPerSplit));
    splits = by_occupancy < by_length ? by_occupancy : by_length;
    if (splits < 1) splits = 1;
  }
  p.keys_per_split = int(ceil_div(ceil_div(p.len, splits), kAttnTileKeys) * kAttnTileKeys);
  p.num_splits = int(ceil_div(p.len, p.keys_per_split));
}

// Workspace, one request: statistics state and scores of the observed rows, then the split
// partials (outputs, (max, sum) pairs, weighted sums). Returns the number of observed queries.
template <class KV>
int carve_attention_workspace(const Context<cuda>& ctx, AttentionParams<KV>& p, AttentionStats stats) {
  const int rows_total = p.n * p.num_heads;
  const int observed = stats.block ? p.n - stats.first_observed : 0;  // first_observed in [0, n]
  const std::size_t obs_rows = std::size_t(observed) * p.num_heads;
  const std::size_t split_rows = p.num_splits > 1 ? std::size_t(p.num_splits) * rows_total : 0;
  WorkspaceCarver carve;
  const std::size_t at_state = carve.take(4 * obs_rows);
  const std::size_t at_scores = carve.take(obs_rows * std::size_t(p.len));
  const std::size_t at_o = carve.take(split_rows * std::size_t(p.head_dim));
  const std::size_t at_ml = carve.take(2 * split_rows);
  const std::size_t at_w = carve.take(observed ? split_rows : 0);
  if (carve.floats) {
    float* ws = ctx.workspace_as<float>(carve.floats);
    if (observed) {
      p.obs_state = reinterpret_cast<float4*>(ws + at_state);
      p.obs_scores = ws + at_scores;
      p.first_observed = stats.first_observed;
      if (split_rows) p.part_w = ws + at_w;
    }
    if (split_rows) {
      p.part_o = ws + at_o;
      p.part_ml = reinterpret_cast<float2*>(ws + at_ml);
    }
  }
  return observed;
}

// After either main kernel: the split combine (more than one split) and the statistics fold
// (observed queries).
template <class KV>
void finish_attention(const Context<cuda>& ctx, const AttentionParams<KV>& p, int kv_heads,
                      AttentionStats stats, int observed) {
  const int rows_total = p.n * p.num_heads;
  if (p.num_splits > 1) {
    const bool vec4 = p.head_dim % 4 == 0;  // partial rows are then 16-byte aligned
    auto combine = observed ? (vec4 ? attention_combine_kernel<true, 4> : attention_combine_kernel<true, 1>)
                            : (vec4 ? attention_combine_kernel<false, 4> : attention_combine_kernel<false, 1>);
    const std::size_t smem = (std::size_t(p.num_splits + 3) / 4 * 4 + kCombineThreads * (vec4 ? 4 : 1)) * sizeof(float);
    combine<<<rows_total, kCombineThreads, smem, ctx.stream()>>>(
        p.out, p.part_o, p.part_ml, p.part_w, p.obs_state, stats.first_observed * p.num_heads,
        rows_total, p.head_dim, p.num_splits);
    DC_CUDA_CHECK_LAUNCH("attention_combine_kernel");
  }
  if (observed) {
    constexpr int kThreads = 128;
    const dim3 stats_grid(unsigned(ceil_div(p.len, kThreads)), unsigned(kv_heads));
    attention_stats_kernel<kThreads><<<stats_grid, kThreads, 0, ctx.stream()>>>(
        stats.block, p.obs_scores, p.obs_state, p.key_pos, p.query_pos + stats.first_observed,
        observed, p.num_heads, p.group, p.len, p.capacity, p.window);
    DC_CUDA_CHECK_LAUNCH("attention_stats_kernel");
  }
}

template <class KV, int HEAD_DIM_CAP, bool PADDED, int ROWS>
void launch_attention(const Context<cuda>& ctx, AttentionParams<KV> p, int kv_heads,
                      AttentionStats stats) {
  const int row_blocks = int(ceil_div(p.rows, ROWS));
  // Split the keys only when the (row block, KV head) grid cannot fill the GPU 4 times over: a
  // block waits on HBM for every tile, so an SM needs several resident (about 36 KB of shared
  // memory each at head_dim 128, so up to 6 fit) to keep the memory system busy; 2 per SM held a
  // 32k decode to 0.93 TB/s on an H200.
  choose_splits(p, row_blocks * kv_heads, 4 * ctx.sm_count());
  const int observed = carve_attention_workspace(ctx, p, stats);
  constexpr std::size_t kSmem = attention_smem_bytes<HEAD_DIM_CAP, ROWS>();
  auto kernel = attention_kernel<KV, HEAD_DIM_CAP, PADDED, ROWS>;
  if constexpr (kSmem > 48 * 1024)  // opt in to more than the default 48 KiB of dynamic smem
    DC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  const dim3 grid(unsigned(row_blocks), unsigned(kv_heads), unsigned(p.num_splits));
  kernel<<<grid, ROWS * kWarpSize, kSmem, ctx.stream()>>>(p);
  DC_CUDA_CHECK_LAUNCH("attention_kernel");
  finish_attention(ctx, p, kv_heads, stats, observed);
}

// One query (n == 1) through decode_attention_kernel (cuda/attention_decode.cuh): one block per
// (KV head, split), splits for one full wave of resident blocks (the kernel keeps its loads in
// flight in registers, so more waves only add tails).
template <class KV, int HEAD_DIM, int G, int UNROLL = kDecodeUnroll<G>, int MIN_BLOCKS = kDecodeMinBlocks>
void launch_decode_attention(const Context<cuda>& ctx, AttentionParams<KV> p, int kv_heads,
                             AttentionStats stats) {
  choose_splits(p, kv_heads, decode_blocks_per_sm<KV, HEAD_DIM, G, UNROLL, MIN_BLOCKS>() * ctx.sm_count());
  const int observed = carve_attention_workspace(ctx, p, stats);
  const dim3 grid(unsigned(kv_heads), unsigned(p.num_splits));
  decode_attention_kernel<KV, HEAD_DIM, G, UNROLL, MIN_BLOCKS>
      <<<grid, kDecodeWarps * kWarpSize, 0, ctx.stream()>>>(p);
  DC_CUDA_CHECK_LAUNCH("decode_attention_kernel");
  finish_attention(ctx, p, kv_heads, stats, observed);
}

// The launch parameters of one attention call (the split fields are the launcher's).
template <class KV>
AttentionParams<KV> attention_params(float* out, const float* q, const KV* k_cache, const KV* v_cache,
                                     const std::int32_t* key_pos, int len, const std::int32_t* query_pos,
                                     int n, const AttentionShape& s) {
  AttentionParams<KV> p{};
  p.out = out;
  p.q = q;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.key_pos = key_pos;
  p.query_pos = query_pos;
  p.len = len;
  p.n = n;
  p.num_heads = s.num_heads;
  p.group = s.num_heads / s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.window = s.window;
  p.capacity = s.capacity;
  p.scale = s.scale;
  p.rows = n * p.group;
  return p;
}

}  // namespace cuda_detail

// out[n, heads*head_dim] = softmax(q K^T * scale + mask) V, per query head; with stats.block
// (device, [kv_heads, stat_rows_per_kv_head(group), capacity]) accumulates the statistics of the
// observed queries t >= stats.first_observed, as the CPU overload. All pointers are device
// pointers; K/V are stored as KV (float or bf16); key_pos is [kv_heads, capacity] (head g's
// slots at key_pos + g * capacity), query_pos has n entries.
template <class KV>
void attention(const Context<cuda>& ctx, float* out, const float* q, const KV* k_cache,
               const KV* v_cache, const std::int32_t* key_pos, int len, const std::int32_t* query_pos, int n,
               const AttentionShape& s, AttentionStats stats = {}) {
  static_assert(std::is_same_v<KV, float> || std::is_same_v<KV, bf16>, "CUDA K/V are stored as float or bf16");
  if (n <= 0) return;
  DC_CHECK(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0,
           "attention: ", s.num_heads, " query heads are not a multiple of ", s.num_kv_heads,
           " KV heads");
  DC_CHECK(len >= 0 && len <= s.capacity, "attention over ", len, " slots of a cache of capacity ",
           s.capacity);
  if (len == 0) {  // nothing to attend to: zeros, as the CPU loop (and no slot to fold into)
    DC_CUDA_CHECK(cudaMemsetAsync(out, 0, std::size_t(n) * s.num_heads * s.head_dim * sizeof(float),
                                  ctx.stream()));
    return;
  }
  // Observed queries are t in [first_observed, n); none observed means no statistics work.
  stats.first_observed = stats.first_observed < 0 ? 0 : stats.first_observed;
  if (stats.first_observed >= n) stats.block = nullptr;
  const cuda_detail::AttentionParams<KV> p =
      cuda_detail::attention_params(out, q, k_cache, v_cache, key_pos, len, query_pos, n, s);
  const bool few_rows = p.rows <= 4;  // decode with small groups: 4 warps, else 8 per block
  // The exact-width variants load K/V tiles 16 bytes at a time; caches from Buffer<T, cuda> are
  // 256-byte aligned (and a tile of 32 rows of 64 or 128 elements starts 16-byte aligned), but a
  // caller's offset pointer may not be, and then the scalar-load (padded) variant of the same
  // width serves it.
  const bool aligned = (reinterpret_cast<std::uintptr_t>(k_cache) |
                        reinterpret_cast<std::uintptr_t>(v_cache)) % 16 == 0;
  DC_DISPATCH_HEAD_DIM(s.head_dim, HEAD_DIM_CAP, PADDED, [&] {
    using namespace cuda_detail;
    const int kvh = s.num_kv_heads;
    if constexpr (!PADDED) {  // one query: the register kernel, up to kDecodeMaxGroup heads
      if (n == 1 && aligned && p.group <= kDecodeMaxGroup) {
        if (p.group == 1) return launch_decode_attention<KV, HEAD_DIM_CAP, 1>(ctx, p, kvh, stats);
        if (p.group <= 4) return launch_decode_attention<KV, HEAD_DIM_CAP, 4>(ctx, p, kvh, stats);
        return launch_decode_attention<KV, HEAD_DIM_CAP, 8>(ctx, p, kvh, stats);
      }
    }
    if (!PADDED && !aligned) {
      if (few_rows) return launch_attention<KV, HEAD_DIM_CAP, true, 4>(ctx, p, kvh, stats);
      return launch_attention<KV, HEAD_DIM_CAP, true, 8>(ctx, p, kvh, stats);
    }
    if (few_rows) return launch_attention<KV, HEAD_DIM_CAP, PADDED, 4>(ctx, p, kvh, stats);
    return launch_attention<KV, HEAD_DIM_CAP, PADDED, 8>(ctx, p, kvh, stats);
  });
}

}  // namespace dc
