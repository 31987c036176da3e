#pragma once
// CUDA optimizer ops (mirrors cpu/adam.hpp) on device arrays of n floats: the Adam update
// (math/adam.hpp), the L2 norm of the gradients and their scaling for global-norm clipping.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "../math/adam.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

inline constexpr int kOptimThreads = 256;
// grad_norm's partial sums: a fixed cap (not a multiple of the SM count), so the summation
// order, and the result, depend only on n.
inline constexpr int kNormBlocks = 1024;

// A template (COMDAT), not a static function: see cuda/attention.cuh.
template <int = 0>
__global__ void adam_kernel(float* DC_RESTRICT params, const float* DC_RESTRICT grads,
                                   float* DC_RESTRICT m, float* DC_RESTRICT v, std::int64_t n,
                                   math::AdamCoefficients c) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    math::adam_step(params[i], grads[i], m[i], v[i], c);
}

// partial[blockIdx.x] = sum of grads[i]^2 over the block's grid-stride share, in double.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    sum_squares_kernel(const float* DC_RESTRICT grads, std::int64_t n, double* partial) {
  using Reduce = cub::BlockReduce<double, THREADS>;
  __shared__ typename Reduce::TempStorage temp;
  const std::int64_t stride = std::int64_t(gridDim.x) * THREADS;
  double s = 0.0;
  for (std::int64_t i = std::int64_t(blockIdx.x) * THREADS + threadIdx.x; i < n; i += stride) {
    const double g = grads[i];
    s += g * g;
  }
  s = Reduce(temp).Sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// A template (COMDAT), not a static function: see cuda/attention.cuh.
template <int = 0>
__global__ void scale_kernel(float* grads, std::int64_t n, float factor) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    grads[i] *= factor;
}

}  // namespace cuda_detail

// params, grads, m, v: device [n]; m and v start at 0 and persist between steps; step = 1, 2, ...
inline void adam_update(const Context<cuda>& ctx, float* params, const float* grads, float* m,
                        float* v, std::int64_t n, const AdamHyper& hyper, int step) {
  math::check_adam_update(params, grads, m, v, n);
  const math::AdamCoefficients c = math::adam_coefficients(hyper, step);
  if (n == 0) return;
  const int threads = cuda_detail::kOptimThreads;
  cuda_detail::adam_kernel<><<<cuda_detail::grid_for(n, threads), threads, 0, ctx.stream()>>>(
      params, grads, m, v, n, c);
  DC_CUDA_CHECK_LAUNCH("adam_kernel");
}

// sqrt(sum_i grads[i]^2) of device grads, accumulated in double. Waits for the stream: the
// norm comes back to the host (the clipping factor is decided there).
inline double grad_norm(const Context<cuda>& ctx, const float* grads, std::int64_t n) {
  math::check_gradients(grads, n, "grad_norm");
  if (n == 0) return 0.0;
  constexpr int kThreads = cuda_detail::kOptimThreads;
  const int blocks = int(cuda_detail::grid_for(n, kThreads, cuda_detail::kNormBlocks));
  double* partial = ctx.workspace_as<double>(std::size_t(blocks));
  cuda_detail::sum_squares_kernel<kThreads><<<blocks, kThreads, 0, ctx.stream()>>>(grads, n,
                                                                                  partial);
  DC_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  std::vector<double> host(static_cast<std::size_t>(blocks));
  DC_CUDA_CHECK(cudaMemcpyAsync(host.data(), partial, host.size() * sizeof(double),
                                cudaMemcpyDeviceToHost, ctx.stream()));
  DC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  double total = 0.0;
  for (double s : host) total += s;
  return std::sqrt(total);
}

// grads[i] *= factor on the device (factor from math::clip_factor; 1 is a no-op).
inline void scale_gradients(const Context<cuda>& ctx, float* grads, std::int64_t n, float factor) {
  math::check_gradients(grads, n, "scale_gradients");
  math::check_scale_factor(factor);
  if (n == 0 || factor == 1.0f) return;
  const int threads = cuda_detail::kOptimThreads;
  cuda_detail::scale_kernel<><<<cuda_detail::grid_for(n, threads), threads, 0, ctx.stream()>>>(
      grads, n, factor);
  DC_CUDA_CHECK_LAUNCH("scale_kernel");
}

}  // namespace dc
