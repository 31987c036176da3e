#pragma once
// CUDA forward and backward of the policy MLP (mirrors cpu/mlp.hpp; math/mlp.hpp has the layout
// and the activation). Device arrays:
//   x [n, inputs], params [parameters], scores [n], saved [n, saved_per_row] (may be null in the
//   forward), dscores [n], dparams [parameters] (the backward adds to it).
//
// The forward and the per-row half of the backward run one thread per row with the units in
// registers (widest layer <= kMlpMaxWidth): the MLP is tiny (about a thousand parameters) and
// rows are many (one per cached slot and head). The parameter gradient is then one block per
// parameter reducing over the rows in a fixed order, so it needs no atomics and gives the same
// bits on every run.
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "../math/mlp.hpp"
#include "check.cuh"
#include "context.cuh"

namespace dc {
namespace cuda_detail {

inline constexpr int kMlpMaxWidth = 64;
inline constexpr int kMlpMaxLayers = 8;

// The layout as plain values a kernel can take by value.
struct MlpDeviceLayout {
  int layers = 0;
  int in[kMlpMaxLayers] = {}, out[kMlpMaxLayers] = {};
  std::int64_t weight[kMlpMaxLayers] = {}, bias[kMlpMaxLayers] = {};
  std::int64_t saved_offset[kMlpMaxLayers] = {};  // of hidden layer l's pre-activations in a row
  int saved_per_row = 0;
  Activation activation = Activation::silu;
};

inline MlpDeviceLayout device_layout(const MlpLayout& L, const char* op) {
  DC_CHECK(L.layers() <= kMlpMaxLayers, op, ": the CUDA MLP takes up to ", kMlpMaxLayers - 1,
           " hidden layers, this one has ", L.hidden.size());
  DC_CHECK(L.widest() <= kMlpMaxWidth, op, ": the CUDA MLP takes layers up to ", kMlpMaxWidth,
           " units wide, this one has ", L.widest());
  MlpDeviceLayout d;
  d.layers = L.layers();
  std::int64_t saved = 0;
  for (int l = 0; l < L.layers(); ++l) {
    d.in[l] = L.in(l);
    d.out[l] = L.out(l);
    d.weight[l] = L.weight_offset(l);
    d.bias[l] = L.bias_offset(l);
    d.saved_offset[l] = saved;
    if (l + 1 < L.layers()) saved += L.out(l);
  }
  d.saved_per_row = int(L.saved_per_row());
  d.activation = L.activation;
  return d;
}

// A template (COMDAT), not a static function: see cuda/attention.cuh.
template <int = 0>
__global__ void mlp_forward_kernel(MlpDeviceLayout L, const float* DC_RESTRICT params,
                                          const float* DC_RESTRICT x, std::int64_t n,
                                          float* DC_RESTRICT scores, float* DC_RESTRICT saved) {
  const std::int64_t row = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= n) return;
  float a[kMlpMaxWidth], z[kMlpMaxWidth];
  for (int i = 0; i < L.in[0]; ++i) a[i] = x[row * L.in[0] + i];
  for (int l = 0; l < L.layers; ++l) {
    const float* W = params + L.weight[l];
    const float* b = params + L.bias[l];
    for (int o = 0; o < L.out[l]; ++o) {
      float acc = b[o];
      for (int i = 0; i < L.in[l]; ++i) acc += W[std::int64_t(o) * L.in[l] + i] * a[i];
      z[o] = acc;
    }
    if (l + 1 == L.layers) {
      scores[row] = z[0];
      return;
    }
    for (int o = 0; o < L.out[l]; ++o) {
      if (saved) saved[row * L.saved_per_row + L.saved_offset[l] + o] = z[o];
      a[o] = math::activate(L.activation, z[o]);
    }
  }
}

// dz [n, saved_per_row]: d loss / d pre-activation of every hidden unit of the row.
// A template (COMDAT), not a static function: see cuda/attention.cuh.
template <int = 0>
__global__ void mlp_backward_rows_kernel(MlpDeviceLayout L, const float* DC_RESTRICT params,
                                                const float* DC_RESTRICT saved,
                                                const float* DC_RESTRICT dscores, std::int64_t n,
                                                float* DC_RESTRICT dz) {
  const std::int64_t row = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= n) return;
  float upper[kMlpMaxWidth], lower[kMlpMaxWidth];
  upper[0] = dscores[row];  // d loss / d output
  for (int l = L.layers - 1; l >= 1; --l) {
    // Layer l's input is hidden layer l - 1's activation: dz_{l-1} = (W_l^T dz_l) * act'(z_{l-1}).
    const float* W = params + L.weight[l];
    const float* pre = saved + row * L.saved_per_row + L.saved_offset[l - 1];
    for (int i = 0; i < L.in[l]; ++i) {
      float s = 0.0f;
      for (int o = 0; o < L.out[l]; ++o) s += W[std::int64_t(o) * L.in[l] + i] * upper[o];
      lower[i] = s * math::activate_derivative(L.activation, pre[i]);
      dz[row * L.saved_per_row + L.saved_offset[l - 1] + i] = lower[i];
    }
    for (int i = 0; i < L.in[l]; ++i) upper[i] = lower[i];
  }
}

// One block per parameter: the sum over rows of d loss / d z_out * (the unit's input), added to
// dparams. Parameter p of layer l is W_l[o, i] or b_l[o].
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    mlp_parameter_gradient_kernel(MlpDeviceLayout L, const float* DC_RESTRICT x,
                                  const float* DC_RESTRICT saved, const float* DC_RESTRICT dz,
                                  const float* DC_RESTRICT dscores, std::int64_t n,
                                  float* DC_RESTRICT dparams) {
  using Reduce = cub::BlockReduce<float, THREADS>;
  __shared__ typename Reduce::TempStorage temp;
  const std::int64_t p = blockIdx.x;
  int l = 0;
  while (l + 1 < L.layers && p >= L.weight[l + 1]) ++l;
  const bool is_bias = p >= L.bias[l];
  const int o = is_bias ? int(p - L.bias[l]) : int((p - L.weight[l]) / L.in[l]);
  const int i = is_bias ? 0 : int((p - L.weight[l]) % L.in[l]);
  const bool last = l + 1 == L.layers;
  float s = 0.0f;
  for (std::int64_t r = threadIdx.x; r < n; r += THREADS) {
    const float g = last ? dscores[r] : dz[r * L.saved_per_row + L.saved_offset[l] + o];
    float input = 1.0f;
    if (!is_bias)
      input = l == 0 ? x[r * L.in[0] + i]
                     : math::activate(L.activation, saved[r * L.saved_per_row + L.saved_offset[l - 1] + i]);
    s += g * input;
  }
  s = Reduce(temp).Sum(s);
  if (threadIdx.x == 0) dparams[p] += s;
}

}  // namespace cuda_detail

inline void mlp_forward(const Context<cuda>& ctx, const MlpLayout& layout, const float* params,
                        const float* x, std::int64_t n, float* scores, float* saved) {
  math::check_mlp_arguments(layout, params, x, n, "mlp_forward");
  const auto L = cuda_detail::device_layout(layout, "mlp_forward");
  if (n == 0) return;
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  cuda_detail::mlp_forward_kernel<><<<blocks, kThreads, 0, ctx.stream()>>>(L, params, x, n, scores, saved);
  DC_CUDA_CHECK_LAUNCH("mlp_forward_kernel");
}

// dz_scratch: device [n, saved_per_row] floats of workspace.
inline void mlp_backward(const Context<cuda>& ctx, const MlpLayout& layout, const float* params,
                         const float* x, const float* saved, const float* dscores, std::int64_t n,
                         float* dparams, float* dz_scratch) {
  math::check_mlp_arguments(layout, params, x, n, "mlp_backward");
  DC_CHECK(n == 0 || (saved && dscores && dparams && dz_scratch), "mlp_backward: null saved "
           "activations, score gradients, parameter gradients or scratch");
  const auto L = cuda_detail::device_layout(layout, "mlp_backward");
  if (n == 0) return;
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  cuda_detail::mlp_backward_rows_kernel<><<<blocks, kThreads, 0, ctx.stream()>>>(L, params, saved, dscores, n,
                                                                              dz_scratch);
  DC_CUDA_CHECK_LAUNCH("mlp_backward_rows_kernel");
  constexpr int kReduceThreads = 256;
  cuda_detail::mlp_parameter_gradient_kernel<kReduceThreads>
      <<<static_cast<unsigned>(layout.parameters()), kReduceThreads, 0, ctx.stream()>>>(
          L, x, saved, dz_scratch, dscores, n, dparams);
  DC_CUDA_CHECK_LAUNCH("mlp_parameter_gradient_kernel");
}

}  // namespace dc
