#pragma once
// CUDA matrix multiply y[n, out] (+)= x[n, in] * w[out, in]^T with fp32 activations, weights of
// type W (float or bf16) and fp32 accumulation (mirrors cpu/gemm.hpp).
//
// Two regimes:
//  - decode / tiny chunks (n <= kGemvMaxRows): the op is bound by reading w once. A hand-written
//    GEMV gives each warp one output row, streams that weight row with 16-byte loads and applies
//    it to all n activation rows at once (they are small and stay in L1/L2), so w is read exactly
//    once whatever n is. Activations stay fp32: the result differs from the CPU oracle only by
//    summation order.
//  - prefill (n > kGemvMaxRows): compute-bound, so cuBLAS. float uses plain SGEMM (no TF32). bf16
//    rounds x to bf16 in the context workspace and runs cublasGemmEx with CUBLAS_COMPUTE_32F
//    (tensor cores, fp32 accumulate, fp32 output): the usual mixed-precision recipe, at the cost
//    of rounding the activations to bf16 (~3 significant digits) on this path only.
// cuBLAS is column-major: a row-major [r, c] matrix is a column-major [c, r] one. So y^T[out, n] =
// (w viewed as [in, out])^T * (x viewed as [in, n]): transa = T, transb = N, m = out, k = in.
#include <cstdint>
#include <type_traits>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "check.cuh"
#include "common.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

// Largest n served by the GEMV kernel; larger chunks go to cuBLAS.
inline constexpr int kGemvMaxRows = 8;

// Weights per 16-byte load.
template <class W>
inline constexpr int kGemvVec = 16 / int(sizeof(W));

// Loads VEC consecutive weights as fp32. VEC == 1 is the unaligned fallback.
template <int VEC>
__device__ __forceinline__ void load_row(const float* DC_RESTRICT p, float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    static_assert(VEC == 1 || VEC == 8, "float rows load 1, 4 or 8 at a time");
    if constexpr (VEC == 8) {
      const float4 a = *reinterpret_cast<const float4*>(p);
      const float4 b = *reinterpret_cast<const float4*>(p + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
      v[0] = p[0];
    }
  }
}
template <int VEC>
__device__ __forceinline__ void load_row(const bf16* DC_RESTRICT p, float (&v)[VEC]) {
  if constexpr (VEC == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // little-endian: element 2i is the low half of word i
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else {
    static_assert(VEC == 1, "bf16 rows load 1 or 8 at a time");
    v[0] = load_float(p);
  }
}

// One warp per output feature o; lanes stride over `in` VEC elements at a time; each weight
// vector is applied to all N activation rows before the next is loaded.
template <class W, int N, int VEC, int WARPS>
__global__ void __launch_bounds__(WARPS * kWarpSize)
    gemv_kernel(float* y, const float* DC_RESTRICT x, const W* DC_RESTRICT w, int in, int out,
                bool accumulate) {
  const int o = blockIdx.x * WARPS + threadIdx.x / kWarpSize;
  if (o >= out) return;  // warp-uniform
  const int lane = threadIdx.x % kWarpSize;
  const W* wr = w + std::int64_t(o) * in;
  float acc[N] = {};
#pragma unroll 4
  for (int k = lane * VEC; k < in; k += kWarpSize * VEC) {
    float wv[VEC];
    load_row<VEC>(wr + k, wv);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      float xv[VEC];
      load_row<VEC>(x + std::int64_t(r) * in + k, xv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[r] = fmaf(wv[i], xv[i], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == r) {  // spread the N stores over N lanes
      float& dst = y[std::int64_t(r) * out + o];
      dst = accumulate ? dst + sum : sum;
    }
  }
}

template <class W, int N>
void launch_gemv(const Context<cuda>& ctx, float* y, const float* x, const W* w, int in, int out,
                 bool accumulate) {
  constexpr int kWarps = 4;
  constexpr int kVec = kGemvVec<W>;
  const unsigned blocks = static_cast<unsigned>(ceil_div(out, kWarps));
  // 16-byte loads need every row start 16-byte aligned: base pointers and the row length.
  const bool vectorised = in % kVec == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 &&
                          reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  if (vectorised)
    gemv_kernel<W, N, kVec, kWarps><<<blocks, kWarps * kWarpSize, 0, ctx.stream()>>>(
        y, x, w, in, out, accumulate);
  else
    gemv_kernel<W, N, 1, kWarps><<<blocks, kWarps * kWarpSize, 0, ctx.stream()>>>(
        y, x, w, in, out, accumulate);
  DC_CUDA_CHECK_LAUNCH("gemv_kernel");
}

template <class W>
void gemv(const Context<cuda>& ctx, float* y, const float* x, const W* w, int n, int in, int out,
          bool accumulate) {
  static_assert(kGemvMaxRows == 8, "update the row dispatch below");
  switch (n) {
    case 1: return launch_gemv<W, 1>(ctx, y, x, w, in, out, accumulate);
    case 2: return launch_gemv<W, 2>(ctx, y, x, w, in, out, accumulate);
    case 3: return launch_gemv<W, 3>(ctx, y, x, w, in, out, accumulate);
    case 4: return launch_gemv<W, 4>(ctx, y, x, w, in, out, accumulate);
    case 5: return launch_gemv<W, 5>(ctx, y, x, w, in, out, accumulate);
    case 6: return launch_gemv<W, 6>(ctx, y, x, w, in, out, accumulate);
    case 7: return launch_gemv<W, 7>(ctx, y, x, w, in, out, accumulate);
    case 8: return launch_gemv<W, 8>(ctx, y, x, w, in, out, accumulate);
    default: DC_FAIL("gemv called with n = ", n, " rows (supported: 1..", kGemvMaxRows, ")");
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
  if (n <= cuda_detail::kGemvMaxRows)
    return cuda_detail::gemv(ctx, y, x, w, n, in, out, accumulate);

  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if constexpr (std::is_same_v<W, float>) {
    DC_CUBLAS_CHECK(cublasSgemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, in,
                                x, in, &beta, y, out));
  } else {
    const std::int64_t count = std::int64_t(n) * in;
    auto* xb = ctx.workspace_as<__nv_bfloat16>(std::size_t(count));
    constexpr int kThreads = 256;
    cuda_detail::float_to_bf16_kernel<><<<cuda_detail::grid_for(count, kThreads, 8 * ctx.sm_count()),
                                        kThreads, 0, ctx.stream()>>>(xb, x, count);
    DC_CUDA_CHECK_LAUNCH("float_to_bf16_kernel");
    DC_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w,
                                 CUDA_R_16BF, in, xb, CUDA_R_16BF, in, &beta, y, CUDA_R_32F, out,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace dc
