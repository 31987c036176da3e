#pragma once
// CUDA KL divergence of logit-row pairs (mirrors cpu/kl.hpp): out[r] = KL(softmax(p[r, :]) ||
// softmax(q[r, :])) for device arrays p, q of [rows, vocab] and out of [rows].
// One block per row: each thread folds a strided share of the vocabulary into a math::OnlineKL
// (coalesced loads, one pass), then the block merges the states with CUB's BlockReduce.
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "../math/kl.hpp"
#include "check.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

struct OnlineKLMerge {
  __device__ __forceinline__ math::OnlineKL operator()(const math::OnlineKL& a,
                                                       const math::OnlineKL& b) const {
    math::OnlineKL r = a;
    r.merge(b);
    return r;
  }
};

template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    kl_rows_kernel(const float* DC_RESTRICT p, const float* DC_RESTRICT q, int vocab,
                   float* DC_RESTRICT out) {
  using Reduce = cub::BlockReduce<math::OnlineKL, THREADS>;
  __shared__ typename Reduce::TempStorage temp;
  const std::int64_t offset = std::int64_t(blockIdx.x) * vocab;
  const float* pr = p + offset;
  const float* qr = q + offset;

  math::OnlineKL state;
  for (int v = threadIdx.x; v < vocab; v += THREADS) state.add(pr[v], qr[v]);
  state = Reduce(temp).Reduce(state, OnlineKLMerge{});
  if (threadIdx.x == 0) out[blockIdx.x] = state.value();
}

}  // namespace cuda_detail

inline void kl_rows(const Context<cuda>& ctx, const float* p_logits, const float* q_logits,
                    int rows, int vocab, float* out) {
  math::check_kl_rows(p_logits, q_logits, rows, vocab, out);
  if (rows == 0) return;
  // Small vocabularies would leave most of a wide block idle; a real one (49152 for SmolLM2)
  // wants many loads in flight per row when only a few rows are in the batch.
  if (vocab < 4096) {
    constexpr int kThreads = 128;
    cuda_detail::kl_rows_kernel<kThreads>
        <<<rows, kThreads, 0, ctx.stream()>>>(p_logits, q_logits, vocab, out);
  } else {
    constexpr int kThreads = 512;
    cuda_detail::kl_rows_kernel<kThreads>
        <<<rows, kThreads, 0, ctx.stream()>>>(p_logits, q_logits, vocab, out);
  }
  DC_CUDA_CHECK_LAUNCH("kl_rows_kernel");
}

}  // namespace dc
