#pragma once
// CUDA RoPE, in place on a chunk's query and key rows, rotate-half convention (mirrors
// cpu/rope.hpp and math/rope.hpp).
//
// The inverse frequencies are computed on the host with math::rope_inv_freq — the very call the
// CPU oracle makes — and passed to the kernel by value. Device powf may differ from the host's by
// an ulp or two, and the angle is pos * inv_freq: at position 32k one ulp of inv_freq moves the
// angle by ~4e-3 rad. Sharing the host-computed value keeps the fp32 angle bit-identical to the
// CPU (and Hugging Face) one; only cosf/sinf (<= 2 ulp on the device) can differ.
#include <cstdint>

#include <cuda_runtime.h>

#include "../math/rope.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

// Heads per block: a decode step's one token spreads over (q + k heads) / 4 blocks (10 for
// Mistral-7B) instead of one block rotating every head (12 us a layer on an H200, 3.8 now). Each
// of a token's blocks computes the token's cos/sin table itself (head_dim / 2 pairs).
inline constexpr int kRopeHeadsPerBlock = 4;
inline constexpr int kRopeMaxPairs = 256;  // head_dim <= 512; the table is a 1 KiB kernel argument

struct RopeFrequencies {
  float inv_freq[kRopeMaxPairs];
};

// One block per token: its cos/sin table goes to shared memory once, then every head's pairs
// (query heads first, then key heads) are rotated by the block's threads.
// A template (COMDAT), not a static function: see cuda/attention.cuh.
template <int = 0>
__global__ void rope_kernel(float* q, float* k, const std::int32_t* DC_RESTRICT pos, int q_heads,
                            int kv_heads, int head_dim, const RopeFrequencies freqs) {
  extern __shared__ float cs[];  // [pairs][2]: cos, sin
  const int t = blockIdx.x;
  const int pairs = head_dim / 2;
  // This block rotates heads [first_head, last_head) of the q and k heads (q first) of token t.
  const int first_head = int(blockIdx.y) * kRopeHeadsPerBlock;
  const int last_head = min(first_head + kRopeHeadsPerBlock, q_heads + kv_heads);
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const float angle = math::rope_angle(pos[t], freqs.inv_freq[i]);
    cs[2 * i] = cosf(angle);
    cs[2 * i + 1] = sinf(angle);
  }
  __syncthreads();
  float* qt = q + std::int64_t(t) * q_heads * head_dim;
  float* kt = k + std::int64_t(t) * kv_heads * head_dim;
  const int total = (last_head - first_head) * pairs;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int head = first_head + e / pairs, i = e % pairs;
    float* v = head < q_heads ? qt + std::int64_t(head) * head_dim
                              : kt + std::int64_t(head - q_heads) * head_dim;
    math::rope_rotate(v[math::rope_half_first(i)], v[math::rope_half_second(i, head_dim)],
                      cs[2 * i], cs[2 * i + 1]);
  }
}

}  // namespace cuda_detail

// q[n, q_heads*head_dim], k[n, kv_heads*head_dim]; token t sits at position pos[t] (device).
inline void rope(const Context<cuda>& ctx, float* q, float* k, const std::int32_t* pos, int n,
                 int q_heads, int kv_heads, int head_dim, float theta) {
  if (n <= 0) return;
  DC_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim / 2 <= cuda_detail::kRopeMaxPairs,
           "CUDA rope supports even head_dim up to ", 2 * cuda_detail::kRopeMaxPairs, ", got ",
           head_dim);
  cuda_detail::RopeFrequencies freqs{};
  const int pairs = head_dim / 2;
  for (int i = 0; i < pairs; ++i) freqs.inv_freq[i] = math::rope_inv_freq(i, head_dim, theta);
  const int threads = 128;
  const std::size_t smem = std::size_t(2) * pairs * sizeof(float);
  const dim3 grid(unsigned(n), unsigned(cuda_detail::ceil_div(q_heads + kv_heads, cuda_detail::kRopeHeadsPerBlock)));
  cuda_detail::rope_kernel<><<<grid, threads, smem, ctx.stream()>>>(q, k, pos, q_heads, kv_heads,
                                                               head_dim, freqs);
  DC_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace dc
