#pragma once
// CUDA attention of one query token (a decode step), the kernel long-context decoding repeats
// every token; cuda/attention.cuh launches it, with its split combine and statistics fold, when
// n == 1, head_dim is 64 or 128, the group has at most kDecodeMaxGroup heads and K/V are 16-byte
// aligned (everything else takes the tiled kernel there).
//
// Why a second kernel: the tiled kernel stages every K/V tile in shared memory as fp32 and each
// of its warps (one per query head) reads the tile back, so on an H200 it is bound by
// shared-memory traffic, not HBM (1.5-1.7 TB/s of 4.8 at 32k). Here K and V go from HBM straight
// into registers and every loaded element serves all the group's query heads at once:
//   - lanes are grouped kLanesPerKey to a key row (16 bytes each: 16 lanes for a bf16 row of 128),
//     so one warp-wide load reads kKeysPerLoad consecutive rows (512 contiguous bytes);
//   - each lane holds its 16-byte slice of the G query vectors and of the G output accumulators;
//     a score is the lane's partial dot product summed over its key group by shuffles;
//   - a step is kUnroll such loads of K and of V per lane; the next step's are issued before
//     the current one is computed (HBM latency hidden by the registers, not by more warps);
//   - an online softmax per (lane group, head) over the step's keys, then the key groups of a
//     warp and the kDecodeWarps warps of the block merge their states (max, sum, weighted sum,
//     output), and the block writes a finished row (one split) or a split's partial for the
//     combine kernel, in exactly the formats the tiled kernel writes.
// Statistics: as the tiled kernel, an observed query (n == 1: the only one) stores each visible
// key's raw scaled score in obs_scores and keeps the weighted sum sum e^(s - m) (s - m) for its
// entropy; attention_stats_kernel folds them into the block afterwards.
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "../math/attention_rules.hpp"
#include "../math/softmax.hpp"
#include "attention_parts.cuh"
#include "common.cuh"

namespace dc::cuda_detail {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeMaxGroup = 8;  // query heads per KV head held in registers

// The default loads per lane per step: 4 of K and 4 of V (8 x 16 bytes in flight while a step
// computes); 2 for large groups, whose queries and accumulators take the registers.
template <int G>
inline constexpr int kDecodeUnroll = G <= 4 ? 4 : 2;
// Resident blocks per SM the register budget is shaped for (launch bounds): 3 blocks of 4 warps
// keep ~48 KB of K/V loads in flight per SM at the default unroll.
inline constexpr int kDecodeMinBlocks = 3;

template <class KV, int HEAD_DIM, int G, int UNROLL>
struct DecodeLayout {
  static constexpr int kVec = 16 / int(sizeof(KV));           // elements per 16-byte load
  static constexpr int kLanesPerKey = HEAD_DIM / kVec;         // lanes sharing one key row
  static constexpr int kKeysPerLoad = kWarpSize / kLanesPerKey;  // rows of one warp-wide load
  static constexpr int kUnroll = UNROLL;                       // loads per lane per step (registers)
  static constexpr int kStepKeys = kKeysPerLoad * kUnroll;
  using Vec = std::conditional_t<std::is_same_v<KV, float>, float4, uint4>;
  static_assert(kLanesPerKey <= kWarpSize && kWarpSize % kLanesPerKey == 0,
                "a key row spans a power-of-two number of lanes of one warp");
  static_assert(G <= kLanesPerKey, "an observed score is stored by the lane whose slice index is its head");
};

__device__ __forceinline__ void widen(const float4 v, float (&f)[4]) {
  f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}
__device__ __forceinline__ void widen(const uint4 v, float (&f)[8]) { widen_bf16x8(v, f); }

// Merges another key subset's state (m2, l2, w2, o2) of the same query head into (m, l, w, o):
// both move to the larger max (w by math::rebased_weighted_sum); an empty state (max -inf,
// nothing summed) contributes nothing.
template <int VEC>
__device__ __forceinline__ void merge_decode_state(float& m, float& l, float& w, float (&o)[VEC],
                                                   float m2, float l2, float w2,
                                                   const float (&o2)[VEC]) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) return;  // both empty
  const float a = m == -INFINITY ? 0.0f : expf(m - M);
  const float b = m2 == -INFINITY ? 0.0f : expf(m2 - M);
  w = math::rebased_weighted_sum(w, l, m, M, a) + math::rebased_weighted_sum(w2, l2, m2, M, b);
  l = l * a + l2 * b;
#pragma unroll
  for (int i = 0; i < VEC; ++i) o[i] = o[i] * a + o2[i] * b;
  m = M;
}

// One block per (KV head, split) = (blockIdx.x, blockIdx.y); G >= p.group (heads past the group
// compute on zero queries and are never written). Requires n == 1, head_dim == HEAD_DIM and
// 16-byte aligned K/V (the launcher checks).
// UNROLL and MIN_BLOCKS are tuning knobs (bench_cuda compares variants); the defaults serve.
template <class KV, int HEAD_DIM, int G, int UNROLL = kDecodeUnroll<G>, int MIN_BLOCKS = kDecodeMinBlocks>
__global__ void __launch_bounds__(kDecodeWarps * kWarpSize, MIN_BLOCKS)
    decode_attention_kernel(const AttentionParams<KV> p) {
  using Layout = DecodeLayout<KV, HEAD_DIM, G, UNROLL>;
  using Vec = typename Layout::Vec;
  constexpr int kVec = Layout::kVec, kLanes = Layout::kLanesPerKey, kU = Layout::kUnroll;
  __shared__ float4 merge_out4[kDecodeWarps * G * HEAD_DIM / 4];  // float4: 16-byte aligned
  __shared__ float3 merge_state[kDecodeWarps][G];                   // (max, sum, weighted)
  float* merge_out = reinterpret_cast<float*>(merge_out4);

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int sub = lane / kLanes;    // which row of a warp-wide load this lane reads
  const int piece = lane % kLanes;  // which 16 bytes of the row
  const int kvh = blockIdx.x, split = blockIdx.y;
  const int head0 = kvh * p.group;  // query heads head0 .. head0 + group - 1 share this KV head
  const bool observed = p.obs_scores != nullptr;  // the one query (first_observed is 0)

  float q[G][kVec];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      q[g][i] = g < p.group ? p.q[std::int64_t(head0 + g) * HEAD_DIM + piece * kVec + i] : 0.0f;
  const int query_pos = p.query_pos[0];

  const std::int64_t head_offset = std::int64_t(kvh) * p.capacity * HEAD_DIM;
  const Vec* kh = reinterpret_cast<const Vec*>(p.k_cache + head_offset) + piece;
  const Vec* vh = reinterpret_cast<const Vec*>(p.v_cache + head_offset) + piece;
  const std::int32_t* kp = p.key_pos + std::int64_t(kvh) * p.capacity;
  const int k_begin = split * p.keys_per_split;
  const int k_end = min(p.len, k_begin + p.keys_per_split);

  float m[G], l[G], w[G], o[G][kVec];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f, w[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[g][i] = 0.0f;
  }

  // A step's rows: base + u * kKeysPerLoad + sub; rows at or past k_end read as zeros (slots
  // past len may hold anything, NaN included, and are never loaded).
  auto load = [&](int base, Vec (&k)[kU], Vec (&v)[kU], int (&pos)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * Layout::kKeysPerLoad + sub;
      if (j < k_end) {
        k[u] = kh[std::int64_t(j) * kLanes];
        v[u] = vh[std::int64_t(j) * kLanes];
        pos[u] = kp[j];
      } else {
        k[u] = Vec{}, v[u] = Vec{}, pos[u] = 0;
      }
    }
  };

  const int stride = kDecodeWarps * Layout::kStepKeys;  // the warps of a block take turns
  Vec kc[kU], vc[kU];
  int pc[kU];
  int base = k_begin + warp * Layout::kStepKeys;
  if (base < k_end) load(base, kc, vc, pc);
  for (; base < k_end; base += stride) {
    Vec kn[kU], vn[kU];
    int pn[kU];
    const bool more = base + stride < k_end;  // warp-uniform
    if (more) load(base + stride, kn, vn, pn);  // in flight while this step is computed

    // Scores: the lane's partial dot products, summed over the kLanes lanes of each row.
    float s[G][kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float kf[kVec];
      widen(kc[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(q[g][i], kf[i], dot);
        s[g][u] = dot;
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int u = 0; u < kU; ++u) s[g][u] += __shfl_xor_sync(kFullMask, s[g][u], offset);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * Layout::kKeysPerLoad + sub;
      const bool visible = j < k_end && math::attends(query_pos, pc[u], p.window);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        s[g][u] = visible ? s[g][u] * p.scale : -INFINITY;
        if (observed && visible && g < p.group && piece == g)
          p.obs_scores[std::int64_t(head0 + g) * p.len + j] = s[g][u];
      }
    }

    // Online softmax per head over the step's keys; prob[g][u] = e^(s - max), 0 if masked.
    float prob[G][kU];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float step_max = s[g][0];
#pragma unroll
      for (int u = 1; u < kU; ++u) step_max = fmaxf(step_max, s[g][u]);
      const float m_new = fmaxf(m[g], step_max);
      float rescale = 1.0f;
      if (m_new == -INFINITY) {  // nothing visible yet (and exp(-inf - -inf) would be NaN)
#pragma unroll
        for (int u = 0; u < kU; ++u) prob[g][u] = 0.0f;
      } else {
        rescale = m[g] == -INFINITY ? 0.0f : expf(m[g] - m_new);
        float sum = 0.0f, weighted = 0.0f;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const bool seen = s[g][u] != -INFINITY;
          prob[g][u] = seen ? expf(s[g][u] - m_new) : 0.0f;
          sum += prob[g][u];
          if (observed && seen) weighted = fmaf(prob[g][u], s[g][u] - m_new, weighted);
        }
        if (observed) w[g] = math::rebased_weighted_sum(w[g], l[g], m[g], m_new, rescale) + weighted;
        l[g] = l[g] * rescale + sum;
        m[g] = m_new;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) o[g][i] *= rescale;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float vf[kVec];
      widen(vc[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < kVec; ++i) o[g][i] = fmaf(prob[g][u], vf[i], o[g][i]);
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < kU; ++u) kc[u] = kn[u], vc[u] = vn[u], pc[u] = pn[u];
    }
  }

  // Merge the warp's rows (lanes `piece` apart by multiples of kLanes hold the same dims).
#pragma unroll
  for (int offset = kLanes; offset < kWarpSize; offset *= 2)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float o2[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) o2[i] = __shfl_xor_sync(kFullMask, o[g][i], offset);
      const float m2 = __shfl_xor_sync(kFullMask, m[g], offset);
      const float l2 = __shfl_xor_sync(kFullMask, l[g], offset);
      const float w2 = __shfl_xor_sync(kFullMask, w[g], offset);
      merge_decode_state(m[g], l[g], w[g], o[g], m2, l2, w2, o2);
    }
  if (sub == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) merge_out[(warp * G + g) * HEAD_DIM + piece * kVec + i] = o[g][i];
      if (piece == 0) merge_state[warp][g] = make_float3(m[g], l[g], w[g]);
    }
  }
  __syncthreads();

  // Merge the block's warps, one thread per (head, dim), warps in order; then the finished row
  // (one split) or this split's partial in the tiled kernel's formats.
  for (int e = threadIdx.x; e < p.group * HEAD_DIM; e += kDecodeWarps * kWarpSize) {
    const int g = e / HEAD_DIM, d = e % HEAD_DIM;
    float M = -INFINITY;
#pragma unroll
    for (int wp = 0; wp < kDecodeWarps; ++wp) M = fmaxf(M, merge_state[wp][g].x);
    float L = 0.0f, W = 0.0f, O = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int wp = 0; wp < kDecodeWarps; ++wp) {
        const float3 st = merge_state[wp][g];
        if (st.x == -INFINITY) continue;
        const float a = expf(st.x - M);
        L = fmaf(a, st.y, L);
        O = fmaf(a, merge_out[(wp * G + g) * HEAD_DIM + d], O);
        if (observed) W += math::rebased_weighted_sum(st.z, st.y, st.x, M, a);
      }
    }
    const int h = head0 + g;
    if (p.num_splits == 1) {
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;  // no visible key: zeros, as the CPU
      p.out[std::int64_t(h) * HEAD_DIM + d] = O * inv;
      if (observed && d == 0) p.obs_state[h] = row_state(M, L, W);
    } else {
      const std::int64_t part = std::int64_t(split) * p.num_heads + h;  // rows_total = heads
      p.part_o[part * HEAD_DIM + d] = O;
      if (d == 0) {
        p.part_ml[part] = make_float2(M, L);
        if (observed) p.part_w[part] = W;
      }
    }
  }
}

// Resident blocks per SM of one instantiation (registers bound it), asked once per process.
template <class KV, int HEAD_DIM, int G, int UNROLL, int MIN_BLOCKS>
int decode_blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, decode_attention_kernel<KV, HEAD_DIM, G, UNROLL, MIN_BLOCKS>,
                                                      kDecodeWarps * kWarpSize, 0) != cudaSuccess)
      (void)cudaGetLastError(), b = 0;
    return b > 0 ? b : 1;
  }();
  return blocks;
}

}  // namespace dc::cuda_detail
