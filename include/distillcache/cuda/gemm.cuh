#pragma once
// CUDA matrix multiply y[n, out] (+)= x[n, in] * w[out, in]^T with fp32 activations, weights of
// type W (float or bf16) and fp32 accumulation (mirrors cpu/gemm.hpp).
//
// Two regimes:
//  - decode / tiny chunks (n <= gemv_max_rows<W>()): the op is bound by reading w once. A
//    hand-written GEMV gives each warp one output row, streams that weight row with 16-byte
//    loads, many in flight, and applies it to all n activation rows at once (staged per k-tile
//    in shared memory), so w is read exactly once whatever n is. Activations stay fp32: the
//    result differs from the CPU oracle only by summation order.
//  - otherwise cuBLAS. float uses plain SGEMM (no TF32). bf16 rounds x to bf16 in the context
//    workspace and runs cublasGemmEx with CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulate, fp32
//    output): the usual mixed-precision recipe, at the cost of rounding the activations to bf16
//    (~3 significant digits) on this path only. For bf16 weights this path starts at n = 2:
//    measured on an H200 at Mistral-7B's shapes, the GEMV streamed w at 2.5-3.9 TB/s for n = 1
//    but 0.7-1.4 TB/s at n = 4 and 0.4-0.7 TB/s at n = 8 (every warp reads n fp32 activations
//    from shared memory per 8 weights), where cuBLAS at n = 16 held 2.0-3.8 TB/s.
// cuBLAS is column-major: a row-major [r, c] matrix is a column-major [c, r] one. So y^T[out, n] =
// (w viewed as [in, out])^T * (x viewed as [in, n]): transa = T, transb = N, m = out, k = in.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/matmul_output.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

// Largest n the GEMV kernel serves (instantiated for 1..kGemvMaxRows); which it does serve
// depends on the weight type, gemv_max_rows.
inline constexpr int kGemvMaxRows = 8;
template <class W>
constexpr int gemv_max_rows() {
  return std::is_same_v<W, bf16> ? 1 : kGemvMaxRows;
}

// Output features per block (one warp each).
inline constexpr int kGemvWarps = 8;

// Activations per row staged in shared memory per k-tile: N x 8 KB (fp32) up to N = 4, N x 4 KB
// beyond, so no instantiation needs more than the default 48 KB of dynamic shared memory.
template <int N>
inline constexpr int kGemvTile = N <= 4 ? 2048 : 1024;

// Weights per 16-byte load.
template <class W>
inline constexpr int kGemvVec = 16 / int(sizeof(W));

// One load of VEC weights as stored (16 bytes, or one element for the unaligned fallback).
template <class W, int VEC>
struct WeightVector;
template <>
struct WeightVector<float, 4> {
  float4 raw;
};
template <>
struct WeightVector<bf16, 8> {
  uint4 raw;
};
template <class W>
struct WeightVector<W, 1> {
  W raw;
};

// Weights are read once per step: the streaming hint (ld.global.cs, evict first) keeps them from
// pushing the staged activations' sources and the KV cache out of L2.
template <class W, int VEC>
__device__ __forceinline__ WeightVector<W, VEC> load_weights(const W* DC_RESTRICT p) {
  if constexpr (VEC == 1) return {*p};
  else if constexpr (std::is_same_v<W, float>) return {__ldcs(reinterpret_cast<const float4*>(p))};
  else return {__ldcs(reinterpret_cast<const uint4*>(p))};
}

// The VEC weights of one load as fp32.
template <class W, int VEC>
__device__ __forceinline__ void widen(const WeightVector<W, VEC>& w, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = load_float(&w.raw);
  } else if constexpr (std::is_same_v<W, float>) {
    v[0] = w.raw.x, v[1] = w.raw.y, v[2] = w.raw.z, v[3] = w.raw.w;
  } else {
    widen_bf16x8(w.raw, v);
  }
}

// VEC consecutive staged activations (16-byte aligned when VEC > 1) as fp32.
template <int VEC>
__device__ __forceinline__ void load_staged(const float* p, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = p[0];
  } else {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(p)[q];
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  }
}

// One matrix of a GEMV launch: y[n, out] (+)= x[n, in] w[out, in]^T.
template <class W>
struct GemvTarget {
  float* y;
  const W* w;
  int out;
};
inline constexpr int kGemvMaxTargets = 3;
template <class W>
struct GemvTargets {
  GemvTarget<W> target[kGemvMaxTargets];
  int block_end[kGemvMaxTargets];  // target t owns blocks [block_end[t-1], block_end[t])
  int count;
};

// y[r, o] (+)= sum_k x[r, k] w[o, k] for N rows r, one warp per output feature o.
//
// Why this shape (decode is bound by reading w once): per k-tile the block stages the N
// activation rows' tile in shared memory (read from L2 once per block, not once per warp as
// global loads through L1 would be, where the streaming weights evict them), then every lane
// issues all of its tile's weight loads (kGemvTile / (32 VEC) of 16 bytes: 8 per lane for bf16
// at N <= 4) before it uses any, so each warp keeps 4 KB of weights in flight; with several
// blocks per SM that covers HBM's latency. Each weight vector is applied to all N rows before
// the next. Inactive warps (o >= out, the last block) still join the tile barriers.
//
// One launch may serve up to kGemvMaxTargets matrices that multiply the same x (Wq, Wk and Wv;
// gate and up): the grid is their blocks one after another, and a block finds its matrix from
// the targets' block ranges. Why: a decode step's small matrices cannot fill the GPU alone (Wk of
// Mistral-7B, 1024 x 4096: 128 blocks for 132 SMs, 1.2 TB/s on an H200), and each launch pays
// its ramp-up and tail.
template <class W, int N, int VEC, int WARPS>
__global__ void __launch_bounds__(WARPS * kWarpSize)
    gemv_kernel(const GemvTargets<W> targets, const float* DC_RESTRICT x, int in, bool accumulate) {
  constexpr int kTile = kGemvTile<N>;
  constexpr int kLoads = kTile / (kWarpSize * VEC);  // weight loads per lane per tile
  static_assert(kLoads * kWarpSize * VEC == kTile, "a tile is whole loads of every lane");
  extern __shared__ float4 gemv_shared[];  // the activation tile [N, kTile]
  float* xs = reinterpret_cast<float*>(gemv_shared);
  int t = 0;  // this block's matrix (block-uniform)
  while (t + 1 < targets.count && int(blockIdx.x) >= targets.block_end[t]) ++t;
  const int first_block = t == 0 ? 0 : targets.block_end[t - 1];
  float* const y = targets.target[t].y;
  const W* DC_RESTRICT const w = targets.target[t].w;
  const int out = targets.target[t].out;
  const int lane = threadIdx.x % kWarpSize;
  const int o = (int(blockIdx.x) - first_block) * WARPS + int(threadIdx.x) / kWarpSize;
  const bool active = o < out;  // warp-uniform
  const W* wr = w + std::int64_t(active ? o : 0) * in;
  float acc[N] = {};
  for (int k0 = 0; k0 < in; k0 += kTile) {
    const int len = in - k0 < kTile ? in - k0 : kTile;  // a multiple of VEC
    __syncthreads();  // every warp is done with the previous tile
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* src = x + std::int64_t(r) * in + k0;
      float* dst = xs + r * kTile;
      if constexpr (VEC == 1) {
        for (int k = threadIdx.x; k < len; k += blockDim.x) dst[k] = src[k];
      } else {  // 16-byte copies: VEC > 1 means x's rows are 16-byte aligned (launch_gemv)
        for (int k = int(threadIdx.x) * 4; k < len; k += int(blockDim.x) * 4)
          *reinterpret_cast<float4*>(dst + k) = *reinterpret_cast<const float4*>(src + k);
      }
    }
    __syncthreads();
    if (!active) continue;
    WeightVector<W, VEC> wv[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int k = (j * kWarpSize + lane) * VEC;
      if (k < len) wv[j] = load_weights<W, VEC>(wr + k0 + k);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int k = (j * kWarpSize + lane) * VEC;
      if (k >= len) continue;
      float wf[VEC];
      widen(wv[j], wf);
#pragma unroll
      for (int r = 0; r < N; ++r) {
        float xv[VEC];
        load_staged<VEC>(xs + r * kTile + k, xv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[r] = fmaf(wf[i], xv[i], acc[r]);
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == r) {  // spread the N stores over N lanes
      float& dst = y[std::int64_t(r) * out + o];
      dst = accumulate ? dst + sum : sum;
    }
  }
}

// 16-byte loads need every row start 16-byte aligned: base pointers and the row length (whole
// VEC-weight loads, and whole float4s of x's fp32 rows).
template <class W>
bool gemv_vectorisable(const float* x, const W* w, int in) {
  return in % kGemvVec<W> == 0 && in % 4 == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
}

template <class W, int N>
void launch_gemv(const Context<cuda>& ctx, GemvTargets<W> targets, const float* x, int in, bool accumulate) {
  constexpr int kVec = kGemvVec<W>;
  bool vectorised = true;
  int blocks = 0;
  for (int t = 0; t < targets.count; ++t) {
    blocks += int(ceil_div(targets.target[t].out, kGemvWarps));
    targets.block_end[t] = blocks;
    vectorised = vectorised && gemv_vectorisable(x, targets.target[t].w, in);
  }
  const std::size_t shared = std::size_t(N) * kGemvTile<N> * sizeof(float);
  if (vectorised)
    gemv_kernel<W, N, kVec, kGemvWarps><<<unsigned(blocks), kGemvWarps * kWarpSize, shared, ctx.stream()>>>(
        targets, x, in, accumulate);
  else
    gemv_kernel<W, N, 1, kGemvWarps><<<unsigned(blocks), kGemvWarps * kWarpSize, shared, ctx.stream()>>>(
        targets, x, in, accumulate);
  DC_CUDA_CHECK_LAUNCH("gemv_kernel");
}

// Dispatches n to the kernel instantiated for it: N = 1 .. gemv_max_rows<W>() (only those are
// compiled).
template <class W, int N = 1>
void gemv(const Context<cuda>& ctx, const GemvTargets<W>& targets, const float* x, int n, int in,
          bool accumulate) {
  if constexpr (N <= gemv_max_rows<W>()) {
    if (n == N) return launch_gemv<W, N>(ctx, targets, x, in, accumulate);
    return gemv<W, N + 1>(ctx, targets, x, n, in, accumulate);
  } else {
    DC_FAIL("gemv called with n = ", n, " rows (supported: 1..", gemv_max_rows<W>(), ")");
  }
}

// A template (COMDAT), not a static function: see cuda/attention.cuh.
template <int = 0>
__global__ void float_to_bf16_kernel(__nv_bfloat16* DC_RESTRICT dst, const float* DC_RESTRICT src,
                                     std::int64_t count) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);  // round to nearest even, as dc::to_bf16
}

// x rounded to bf16 in the context's workspace (valid until the next workspace() call), the
// cuBLAS path's input for bf16 weights.
inline const __nv_bfloat16* bf16_activations(const Context<cuda>& ctx, const float* x, std::int64_t count) {
  auto* xb = ctx.workspace_as<__nv_bfloat16>(std::size_t(count));
  constexpr int kThreads = 256;
  float_to_bf16_kernel<><<<grid_for(count, kThreads, 8 * ctx.sm_count()), kThreads, 0, ctx.stream()>>>(xb, x, count);
  DC_CUDA_CHECK_LAUNCH("float_to_bf16_kernel");
  return xb;
}

// y[n, out] (+)= xb[n, in] w[out, in]^T on the tensor cores, fp32 accumulation and output.
inline void gemm_bf16(const Context<cuda>& ctx, float* y, const __nv_bfloat16* xb, const bf16* w, int n, int in,
                      int out, bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DC_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, CUDA_R_16BF, in,
                               xb, CUDA_R_16BF, in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

}  // namespace cuda_detail

// y[n, out] = x[n, in] * w[out, in]^T, or y += ... when accumulate (fuses the residual add).
// All pointers are device pointers; y must not alias x.
template <class W>
  requires(std::is_same_v<W, float> || std::is_same_v<W, bf16>)
void matmul(const Context<cuda>& ctx, float* y, const float* x, const W* w, int n, int in, int out,
            bool accumulate = false) {
  if (n <= 0 || out <= 0) return;
  if (in <= 0) {  // empty sum, as the CPU loop: y = 0 (or unchanged when accumulating)
    if (!accumulate)
      DC_CUDA_CHECK(cudaMemsetAsync(y, 0, std::size_t(n) * out * sizeof(float), ctx.stream()));
    return;
  }
  if (n <= cuda_detail::gemv_max_rows<W>()) {
    cuda_detail::GemvTargets<W> one{};
    one.target[0] = {y, w, out};
    one.count = 1;
    return cuda_detail::gemv(ctx, one, x, n, in, accumulate);
  }

  if constexpr (std::is_same_v<W, float>) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    DC_CUBLAS_CHECK(cublasSgemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, in,
                                x, in, &beta, y, out));
  } else {
    cuda_detail::gemm_bf16(ctx, y, cuda_detail::bf16_activations(ctx, x, std::int64_t(n) * in), w, n, in,
                           out, accumulate);
  }
}

// The products of several matrices with one input, y_t[n, out_t] = x[n, in] w_t[out_t, in]^T (the
// attention block's q, k and v; the feed-forward's gate and up): where the GEMV serves n, one
// launch for all of them (see gemv_kernel), else one cuBLAS call each (bf16 weights: x rounded to
// bf16 once). Same results as separate calls.
template <class W>
  requires(std::is_same_v<W, float> || std::is_same_v<W, bf16>)
void matmul_shared_input(const Context<cuda>& ctx, const float* x, int n, int in,
                         std::initializer_list<MatmulOutput<W>> outputs) {
  DC_CHECK(outputs.size() <= std::size_t(cuda_detail::kGemvMaxTargets), "matmul_shared_input: at most ",
           cuda_detail::kGemvMaxTargets, " outputs, got ", outputs.size());
  if (n <= 0) return;
  if (in <= 0) {  // empty sums: matmul's zeros
    for (const MatmulOutput<W>& o : outputs) matmul(ctx, o.y, x, o.w, n, in, o.out);
    return;
  }
  if (n <= cuda_detail::gemv_max_rows<W>()) {
    cuda_detail::GemvTargets<W> targets{};
    for (const MatmulOutput<W>& o : outputs)
      if (o.out > 0) targets.target[targets.count++] = {o.y, o.w, o.out};
    if (targets.count > 0) cuda_detail::gemv(ctx, targets, x, n, in, /*accumulate=*/false);
    return;
  }
  if constexpr (std::is_same_v<W, bf16>) {  // x rounded to bf16 once for all of them
    const __nv_bfloat16* xb = cuda_detail::bf16_activations(ctx, x, std::int64_t(n) * in);
    for (const MatmulOutput<W>& o : outputs)
      if (o.out > 0) cuda_detail::gemm_bf16(ctx, o.y, xb, o.w, n, in, o.out, /*accumulate=*/false);
  } else {
    for (const MatmulOutput<W>& o : outputs) matmul(ctx, o.y, x, o.w, n, in, o.out);
  }
}

}  // namespace dc
