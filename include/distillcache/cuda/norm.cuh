#pragma once
// CUDA RMSNorm over rows: y[n, d] = x[n, d] * rms_inv(row) * w[d] (mirrors cpu/norm.hpp).
// One block per row; y may alias x because each thread reads and writes only its own elements.
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "../math/rmsnorm.hpp"
#include "check.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_kernel(float* y, const float* x, const float* DC_RESTRICT w, int d, float eps) {
  using Reduce = cub::BlockReduce<float, THREADS>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_shared;
  const float* xr = x + std::int64_t(blockIdx.x) * d;
  float* yr = y + std::int64_t(blockIdx.x) * d;

  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += THREADS) ss += xr[i] * xr[i];
  ss = Reduce(temp).Sum(ss);
  if (threadIdx.x == 0) inv_shared = math::rms_inv(ss, d, eps);
  __syncthreads();
  const float inv = inv_shared;
  for (int i = threadIdx.x; i < d; i += THREADS) yr[i] = xr[i] * inv * w[i];
}

}  // namespace cuda_detail

inline void rmsnorm(const Context<cuda>& ctx, float* y, const float* x, const float* w, int n,
                    int d, float eps) {
  if (n <= 0 || d <= 0) return;
  constexpr int kThreads = 256;
  cuda_detail::rmsnorm_kernel<kThreads><<<n, kThreads, 0, ctx.stream()>>>(y, x, w, d, eps);
  DC_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

}  // namespace dc
