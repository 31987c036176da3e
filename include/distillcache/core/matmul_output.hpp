#pragma once
// One product of matmul_shared_input (cuda/gemm.cuh): y[n, out] = x[n, in] w[out, in]^T for a
// weight matrix w stored as W, next to others that multiply the same x.

namespace dc {

template <class W>
struct MatmulOutput {
  float* y;
  const W* w;
  int out;
};

}  // namespace dc
