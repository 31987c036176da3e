#pragma once
// CPU RMSNorm over rows: y[n, d] = x[n, d] * rms_inv(row) * w[d]. y may alias x.
#include <cstdint>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/rmsnorm.hpp"

namespace dc {

inline void rmsnorm(const Context<cpu>&, float* y, const float* x, const float* w, int n, int d,
                    float eps) {
DC_OMP(parallel for schedule(static) if (n > 1))
  for (int t = 0; t < n; ++t) {
    const float* xr = x + std::int64_t(t) * d;
    float* yr = y + std::int64_t(t) * d;
    float ss = 0.0f;
    for (int i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = math::rms_inv(ss, d, eps);
    for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

}  // namespace dc
