#pragma once
// Pieces shared by the CUDA attention kernels (cuda/attention.cuh: the tiled kernel for any
// number of queries, the split combine and the statistics fold; cuda/attention_decode.cuh: the
// one-query decode kernel): the launch parameters, the bf16 widening, an observed row's final
// softmax state and the workspace carving.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "../math/features.hpp"
#include "common.cuh"

namespace dc::cuda_detail {

inline constexpr int kAttnTileKeys = kWarpSize;  // one key per lane in the score phase
inline constexpr int kAttnMinKeysPerSplit = 256;  // below this a split's fixed cost dominates

template <class KV>
struct AttentionParams {
  float* out;                      // [n, heads*head_dim]
  const float* q;                  // [n, heads*head_dim]
  const KV* k_cache;               // [kv_heads, capacity, head_dim]
  const KV* v_cache;               // [kv_heads, capacity, head_dim]
  const std::int32_t* key_pos;     // [kv_heads, capacity]
  const std::int32_t* query_pos;   // [n]
  float* part_o;                   // [splits, n*heads, head_dim] unnormalised partial outputs
  float2* part_ml;                 // [splits, n*heads] (running max, running sum)
  // Statistics (null when off): observed rows are queries t >= first_observed.
  float* obs_scores;               // [n - first_observed, heads, len] raw scaled scores
  float4* obs_state;               // [n - first_observed, heads] (max, 1/Z, entropy, 0)
  float* part_w;                   // [splits, n*heads] sum of e^(s - max) (s - max), split path
  int first_observed;
  int len, n, num_heads, group, head_dim, window, capacity;
  float scale;
  int rows;            // n * group query rows per KV head
  int keys_per_split;  // multiple of kAttnTileKeys
  int num_splits;
};

// Widens 8 bf16 (one 16-byte load) into 8 floats at dst (16-byte aligned).
__device__ __forceinline__ void store_widened(float* dst, uint4 w) {
  float f[8];
  widen_bf16x8(w, f);
  *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
  *reinterpret_cast<float4*>(dst + 4) = make_float4(f[4], f[5], f[6], f[7]);
}

// Final softmax state of an observed row from its max, partition sum Z and weighted sum
// sum e^(s - max) (s - max): (max, 1/Z, entropy in nats, 0). As the CPU, a row that sees no key
// has entropy 0 (and no visible slot, so 1/Z is never used).
__device__ __forceinline__ float4 row_state(float max, float sum, float weighted) {
  if (!(sum > 0.0f)) return make_float4(-INFINITY, 0.0f, 0.0f, 0.0f);
  const float inv = 1.0f / sum;
  return make_float4(max, inv, math::softmax_entropy(logf(sum), weighted * inv), 0.0f);
}

// Carves one workspace request into 16-byte aligned float sections (a single workspace() call:
// a second one could reallocate and drop the first's contents).
struct WorkspaceCarver {
  std::size_t floats = 0;
  std::size_t take(std::size_t count) {
    const std::size_t at = floats;
    floats += (count + 3) / 4 * 4;
    return at;
  }
};

}  // namespace dc::cuda_detail
