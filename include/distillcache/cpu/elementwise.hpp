#pragma once
// Small CPU ops of the forward pass: embedding gather, SwiGLU / GeGLU, scale, residual add,
// soft-capping, softmax rows.
#include <cmath>
#include <cstdint>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../math/activation.hpp"
#include "../math/softmax.hpp"

namespace dc {

// out[n, d] = table[tokens[t], :]; tokens are validated by the caller.
template <class W>
void embedding(const Context<cpu>&, float* out, const std::int32_t* tokens, int n, const W* table,
               int d) {
  for (int t = 0; t < n; ++t) {
    const W* row = table + std::int64_t(tokens[t]) * d;
    for (int i = 0; i < d; ++i) out[std::int64_t(t) * d + i] = to_float_any(row[i]);
  }
}

// gate[i] = silu(gate[i]) * up[i] for i < count.
inline void swiglu(const Context<cpu>&, float* gate, const float* up, std::int64_t count) {
DC_OMP(parallel for schedule(static) if (count > 65536))
  for (std::int64_t i = 0; i < count; ++i) gate[i] = math::swiglu(gate[i], up[i]);
}

// gate[i] = gelu_tanh(gate[i]) * up[i] for i < count (Gemma's GeGLU).
inline void geglu(const Context<cpu>&, float* gate, const float* up, std::int64_t count) {
DC_OMP(parallel for schedule(static) if (count > 65536))
  for (std::int64_t i = 0; i < count; ++i) gate[i] = math::geglu(gate[i], up[i]);
}

// x[i] *= s for i < count (Gemma's embedding scale).
inline void scale_values(const Context<cpu>&, float* x, float s, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) x[i] *= s;
}

// x[i] += y[i] for i < count (the residual add after Gemma's output norms).
inline void add_residual(const Context<cpu>&, float* x, const float* y, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) x[i] += y[i];
}

// x[i] = cap * tanh(x[i] / cap) for i < count (final-logit soft-capping).
inline void softcap(const Context<cpu>&, float* x, float cap, std::int64_t count) {
DC_OMP(parallel for schedule(static) if (count > 65536))
  for (std::int64_t i = 0; i < count; ++i) x[i] = math::softcap(x[i], cap);
}

// y[n, cols] = softmax(x[n, cols]) along each row. y may alias x.
inline void softmax_rows(const Context<cpu>&, float* y, const float* x, int n, int cols) {
  for (int r = 0; r < n; ++r) {
    const float* xr = x + std::int64_t(r) * cols;
    float* yr = y + std::int64_t(r) * cols;
    float m = -INFINITY;
    for (int i = 0; i < cols; ++i) m = fmaxf(m, xr[i]);
    float sum = 0.0f;
    for (int i = 0; i < cols; ++i) {
      yr[i] = expf(xr[i] - m);
      sum += yr[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < cols; ++i) yr[i] *= inv;
  }
}

}  // namespace dc
