#pragma once
// Adam (Kingma & Ba, 2015) with bias correction and optional decoupled weight decay (AdamW,
// Loshchilov & Hutter), for the policy MLP's parameters, plus the global-norm clipping factor.
//
// Per element, at step t >= 1, with gradient g:
//   m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
//   p <- p (1 - lr wd) - lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// The bias corrections depend only on t, so adam_coefficients folds them (and the checks) into
// one host call per step; adam_step is the element update both backends run.
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"
#include "../core/error.hpp"

namespace dc {

// The hyper-parameters a user sets (PyTorch's defaults), passed to adam_update.
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW); 0 = plain Adam
};

namespace math {

// One step's constants, in the rearrangement PyTorch uses (one sqrt, no per-element division
// by the bias corrections): p <- p keep - step_size m / (sqrt(v) inv_sqrt_bc2 + eps).
struct AdamCoefficients {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float keep;          // 1 - lr weight_decay
};

// Host only: checks the hyper-parameters and the step, then computes the constants in double.
inline AdamCoefficients adam_coefficients(const AdamHyper& h, int step) {
  DC_CHECK(std::isfinite(h.lr) && h.lr >= 0.0f, "adam: lr must be finite and >= 0, got ", h.lr);
  DC_CHECK(h.beta1 >= 0.0f && h.beta1 < 1.0f, "adam: beta1 must be in [0, 1), got ", h.beta1);
  DC_CHECK(h.beta2 >= 0.0f && h.beta2 < 1.0f, "adam: beta2 must be in [0, 1), got ", h.beta2);
  DC_CHECK(std::isfinite(h.eps) && h.eps > 0.0f, "adam: eps must be finite and > 0, got ", h.eps);
  DC_CHECK(std::isfinite(h.weight_decay) && h.weight_decay >= 0.0f,
           "adam: weight_decay must be finite and >= 0, got ", h.weight_decay);
  DC_CHECK(step >= 1, "adam: step must be >= 1 (the first update is step 1), got ", step);
  const double bc1 = 1.0 - std::pow(double(h.beta1), step);
  const double bc2 = 1.0 - std::pow(double(h.beta2), step);
  AdamCoefficients c{};
  c.beta1 = h.beta1;
  c.one_minus_beta1 = float(1.0 - double(h.beta1));
  c.beta2 = h.beta2;
  c.one_minus_beta2 = float(1.0 - double(h.beta2));
  c.step_size = float(double(h.lr) / bc1);
  c.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  c.eps = h.eps;
  c.keep = float(1.0 - double(h.lr) * double(h.weight_decay));
  return c;
}

// The element update: param, m, v in place.
DC_HD void adam_step(float& param, float grad, float& m, float& v, const AdamCoefficients& c) {
  m = c.beta1 * m + c.one_minus_beta1 * grad;
  v = c.beta2 * v + c.one_minus_beta2 * (grad * grad);
  const float denom = sqrtf(v) * c.inv_sqrt_bc2 + c.eps;
  param = param * c.keep - c.step_size * m / denom;
}

// Host only: pointer and length checks shared by the CPU and CUDA optimizer ops.
inline void check_adam_update(const float* params, const float* grads, const float* m,
                              const float* v, std::int64_t n) {
  DC_CHECK(n >= 0, "adam_update: n must be >= 0, got ", n);
  DC_CHECK(n == 0 || (params && grads && m && v), "adam_update: null pointer for ",
           !params ? "params" : !grads ? "grads" : !m ? "m" : "v", " with n = ", n);
}
inline void check_gradients(const float* grads, std::int64_t n, const char* op) {
  DC_CHECK(n >= 0, op, ": n must be >= 0, got ", n);
  DC_CHECK(n == 0 || grads, op, ": null gradient pointer with n = ", n);
}
inline void check_scale_factor(float factor) {
  DC_CHECK(std::isfinite(factor), "scale_gradients: factor must be finite, got ", factor);
}

// Global-norm clipping: the factor that scales gradients of L2 norm `norm` to at most max_norm
// (1 when they are within it). A non-finite norm is an error, not something to scale away: it
// means the loss or a gradient blew up, and every parameter would become NaN.
inline float clip_factor(double norm, double max_norm) {
  DC_CHECK(std::isfinite(max_norm) && max_norm > 0.0,
           "clip_factor: max_norm must be finite and > 0, got ", max_norm);
  DC_CHECK(std::isfinite(norm) && norm >= 0.0, "clip_factor: the gradient norm is ", norm,
           " (NaN or inf gradients)");
  return norm > max_norm ? float(max_norm / norm) : 1.0f;
}

}  // namespace math
}  // namespace dc
