#pragma once
// Small device helpers shared by the CUDA kernels: warp reductions, bf16 loads, grid sizing.
#include <cstdint>

#include <cuda_runtime.h>

#include "../core/dtype.hpp"

namespace dc::cuda_detail {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Butterfly reductions: every lane ends with the result, so no broadcast step is needed.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Storage -> fp32. dc::bf16 has the bytes of __nv_bfloat16 (the top half of a binary32), so
// widening is a shift: exact, and no cuda_bf16.h types leak into the shared weight structs.
__device__ __forceinline__ float bf16_bits_to_float(std::uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}
// 8 bf16 in one 16-byte load as fp32: element 2i is the low half of 32-bit word i (little-endian).
__device__ __forceinline__ void widen_bf16x8(const uint4 v, float (&f)[8]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ float load_float(const float* p) { return *p; }
__device__ __forceinline__ float load_float(const bf16* p) { return bf16_bits_to_float(p->bits); }

// fp32 -> storage; bf16 by the host's rule (dc::bf16_bits_of, core/dtype.hpp), bit for bit.
__device__ __forceinline__ void store_float(float* p, float f) { *p = f; }
__device__ __forceinline__ void store_float(bf16* p, float f) { p->bits = bf16_bits_of(__float_as_uint(f)); }

// Grid-stride loops use a grid capped at a few waves: enough blocks to fill every SM, no more.
inline unsigned grid_for(std::int64_t count, int threads, int max_blocks = 65535) {
  const std::int64_t blocks = ceil_div(count, threads);
  return static_cast<unsigned>(blocks < max_blocks ? (blocks > 0 ? blocks : 1) : max_blocks);
}

}  // namespace dc::cuda_detail
