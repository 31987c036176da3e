#pragma once
// CPU optimizer ops for the policy's parameters (flat float arrays of n entries): the Adam
// update (math/adam.hpp), the L2 norm of the gradients and their scaling for global-norm
// clipping:
//   double norm = grad_norm(ctx, g, n);
//   scale_gradients(ctx, g, n, math::clip_factor(norm, max_norm));
//   adam_update(ctx, params, g, m, v, n, hyper, step);
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/adam.hpp"

namespace dc {
namespace cpu_detail {

// Elementwise ops go parallel from this many entries (below, the fork costs more than the work).
inline constexpr std::int64_t kOptimParallelFrom = std::int64_t(1) << 15;
// grad_norm sums fixed chunks of this size (in parallel) and then the chunk sums in order, so
// the result is the same for every thread count.
inline constexpr std::int64_t kNormChunk = std::int64_t(1) << 15;

}  // namespace cpu_detail

// params, grads, m, v: [n]; m and v start at 0 and persist between steps; step = 1, 2, ...
inline void adam_update(const Context<cpu>&, float* params, const float* grads, float* m, float* v,
                        std::int64_t n, const AdamHyper& hyper, int step) {
  math::check_adam_update(params, grads, m, v, n);
  const math::AdamCoefficients c = math::adam_coefficients(hyper, step);
DC_OMP(parallel for schedule(static) if (n >= cpu_detail::kOptimParallelFrom))
  for (std::int64_t i = 0; i < n; ++i) math::adam_step(params[i], grads[i], m[i], v[i], c);
}

// sqrt(sum_i grads[i]^2), accumulated in double.
inline double grad_norm(const Context<cpu>&, const float* grads, std::int64_t n) {
  math::check_gradients(grads, n, "grad_norm");
  const auto sum_squares = [grads, n](std::int64_t chunk) {
    const std::int64_t end = std::min(n, (chunk + 1) * cpu_detail::kNormChunk);
    double s = 0.0;
    for (std::int64_t i = chunk * cpu_detail::kNormChunk; i < end; ++i)
      s += double(grads[i]) * double(grads[i]);
    return s;
  };
  const std::int64_t chunks = (n + cpu_detail::kNormChunk - 1) / cpu_detail::kNormChunk;
  if (chunks <= 1) return std::sqrt(chunks ? sum_squares(0) : 0.0);
  std::vector<double> partial(std::size_t(chunks), 0.0);
DC_OMP(parallel for schedule(static))
  for (std::int64_t c = 0; c < chunks; ++c) partial[std::size_t(c)] = sum_squares(c);
  double total = 0.0;
  for (double s : partial) total += s;
  return std::sqrt(total);
}

// grads[i] *= factor (factor from math::clip_factor; 1 leaves them as they are).
inline void scale_gradients(const Context<cpu>&, float* grads, std::int64_t n, float factor) {
  math::check_gradients(grads, n, "scale_gradients");
  math::check_scale_factor(factor);
  if (factor == 1.0f) return;
DC_OMP(parallel for schedule(static) if (n >= cpu_detail::kOptimParallelFrom))
  for (std::int64_t i = 0; i < n; ++i) grads[i] *= factor;
}

}  // namespace dc
