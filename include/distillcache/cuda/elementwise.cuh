#pragma once
// CUDA embedding gather, SwiGLU / GeGLU, scale, residual add, soft-capping and row softmax
// (mirrors cpu/elementwise.hpp).
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "../core/dtype.hpp"
#include "../math/activation.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

template <class W>
__global__ void embedding_kernel(float* DC_RESTRICT out, const std::int32_t* DC_RESTRICT tokens,
                                 const W* DC_RESTRICT table, int d) {
  const int t = blockIdx.x;
  const W* row = table + std::int64_t(tokens[t]) * d;
  float* o = out + std::int64_t(t) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = load_float(row + i);
}

// Every pointwise op of the forward pass (math/activation.hpp) is one grid-stride loop over
// op(i); the ops are small functors (extended lambdas would need --extended-lambda). A template
// (COMDAT), not a static function: see cuda/attention.cuh.
template <class Op>
__global__ void pointwise_kernel(Op op, std::int64_t count) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    op(i);
}

template <class Op>
inline void launch_pointwise(const Context<cuda>& ctx, Op op, std::int64_t count, const char* name) {
  if (count <= 0) return;
  constexpr int kThreads = 256;
  pointwise_kernel<Op><<<grid_for(count, kThreads, 16 * ctx.sm_count()), kThreads, 0, ctx.stream()>>>(op, count);
  DC_CUDA_CHECK_LAUNCH(name);
}

struct SwigluOp {
  float* gate;
  const float* up;
  __device__ void operator()(std::int64_t i) const { gate[i] = math::swiglu(gate[i], up[i]); }
};
struct GegluOp {
  float* gate;
  const float* up;
  __device__ void operator()(std::int64_t i) const { gate[i] = math::geglu(gate[i], up[i]); }
};
struct ScaleOp {
  float* x;
  float s;
  __device__ void operator()(std::int64_t i) const { x[i] *= s; }
};
struct AddOp {
  float* x;
  const float* y;
  __device__ void operator()(std::int64_t i) const { x[i] += y[i]; }
};
struct SoftcapOp {
  float* x;
  float cap;
  __device__ void operator()(std::int64_t i) const { x[i] = math::softcap(x[i], cap); }
};

// One block per row: max, then sum of exponentials, then scale — the CPU oracle's three passes.
// Each thread touches the same indices in every pass, so y may alias x.
template <int THREADS>
__global__ void __launch_bounds__(THREADS) softmax_rows_kernel(float* y, const float* x, int cols) {
  using Reduce = cub::BlockReduce<float, THREADS>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float shared_value;
  const float* xr = x + std::int64_t(blockIdx.x) * cols;
  float* yr = y + std::int64_t(blockIdx.x) * cols;

  float m = -INFINITY;
  for (int i = threadIdx.x; i < cols; i += THREADS) m = fmaxf(m, xr[i]);
  m = Reduce(temp).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) shared_value = m;
  __syncthreads();
  m = shared_value;
  __syncthreads();  // temp and shared_value are reused below

  float sum = 0.0f;
  for (int i = threadIdx.x; i < cols; i += THREADS) {
    const float e = expf(xr[i] - m);
    yr[i] = e;
    sum += e;
  }
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) shared_value = 1.0f / sum;
  __syncthreads();
  const float inv = shared_value;
  for (int i = threadIdx.x; i < cols; i += THREADS) yr[i] *= inv;
}

}  // namespace cuda_detail

// out[n, d] = table[tokens[t], :]; tokens are device-resident and validated by the caller.
template <class W>
void embedding(const Context<cuda>& ctx, float* out, const std::int32_t* tokens, int n,
               const W* table, int d) {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, bf16>,
                "CUDA embedding supports float and bf16 tables");
  if (n <= 0 || d <= 0) return;
  cuda_detail::embedding_kernel<W><<<n, 256, 0, ctx.stream()>>>(out, tokens, table, d);
  DC_CUDA_CHECK_LAUNCH("embedding_kernel");
}

// gate[i] = silu(gate[i]) * up[i] for i < count.
inline void swiglu(const Context<cuda>& ctx, float* gate, const float* up, std::int64_t count) {
  cuda_detail::launch_pointwise(ctx, cuda_detail::SwigluOp{gate, up}, count, "swiglu");
}

// gate[i] = gelu_tanh(gate[i]) * up[i] for i < count (Gemma's GeGLU).
inline void geglu(const Context<cuda>& ctx, float* gate, const float* up, std::int64_t count) {
  cuda_detail::launch_pointwise(ctx, cuda_detail::GegluOp{gate, up}, count, "geglu");
}

// x[i] *= s for i < count (Gemma's embedding scale).
inline void scale_values(const Context<cuda>& ctx, float* x, float s, std::int64_t count) {
  cuda_detail::launch_pointwise(ctx, cuda_detail::ScaleOp{x, s}, count, "scale_values");
}

// x[i] += y[i] for i < count (the residual add after Gemma's output norms).
inline void add_residual(const Context<cuda>& ctx, float* x, const float* y, std::int64_t count) {
  cuda_detail::launch_pointwise(ctx, cuda_detail::AddOp{x, y}, count, "add_residual");
}

// x[i] = cap * tanh(x[i] / cap) for i < count (final-logit soft-capping).
inline void softcap(const Context<cuda>& ctx, float* x, float cap, std::int64_t count) {
  cuda_detail::launch_pointwise(ctx, cuda_detail::SoftcapOp{x, cap}, count, "softcap");
}

// y[n, cols] = softmax(x[n, cols]) along each row. y may alias x.
inline void softmax_rows(const Context<cuda>& ctx, float* y, const float* x, int n, int cols) {
  if (n <= 0 || cols <= 0) return;
  constexpr int kThreads = 256;
  cuda_detail::softmax_rows_kernel<kThreads><<<n, kThreads, 0, ctx.stream()>>>(y, x, cols);
  DC_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
}

}  // namespace dc
