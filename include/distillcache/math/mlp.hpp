#pragma once
// The learned policy's MLP: its parameter layout and its activation, shared by both backends.
//
// inputs -> hidden[0] -> ... -> hidden[k-1] -> 1 score, an activation after every hidden layer,
// none after the last. All parameters live in one flat block (llm.c's layout), layer after
// layer: W_l [out_l, in_l] row-major, then b_l [out_l]; the offsets table below says where each
// starts, so an optimizer is one loop over the block.
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"

namespace dc {

enum class Activation { silu, tanh, relu };

inline const char* activation_name(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::tanh: return "tanh";
    case Activation::relu: return "relu";
  }
  return "?";
}

inline Activation parse_activation(std::string_view name) {
  if (name == "silu") return Activation::silu;
  if (name == "tanh") return Activation::tanh;
  if (name == "relu") return Activation::relu;
  DC_FAIL("unknown activation '", std::string(name), "' (known: silu, tanh, relu)");
}

struct MlpLayout {
  int inputs = 0;
  std::vector<int> hidden;
  Activation activation = Activation::silu;

  MlpLayout() = default;
  MlpLayout(int inputs_, std::vector<int> hidden_, Activation activation_ = Activation::silu)
      : inputs(inputs_), hidden(std::move(hidden_)), activation(activation_) {
    DC_CHECK(inputs > 0 && inputs <= 64, "mlp: ", inputs, " inputs (1 to 64)");
    DC_CHECK(!hidden.empty(), "mlp: no hidden layer");
    for (int h : hidden) DC_CHECK(h > 0 && h <= 4096, "mlp: hidden layer of ", h, " units (1 to 4096)");
  }

  int layers() const { return int(hidden.size()) + 1; }  // weight matrices
  int in(int l) const { return l == 0 ? inputs : hidden[std::size_t(l - 1)]; }
  int out(int l) const { return l == int(hidden.size()) ? 1 : hidden[std::size_t(l)]; }
  std::int64_t weight_offset(int l) const {
    std::int64_t off = 0;
    for (int i = 0; i < l; ++i) off += std::int64_t(in(i)) * out(i) + out(i);
    return off;
  }
  std::int64_t bias_offset(int l) const { return weight_offset(l) + std::int64_t(in(l)) * out(l); }
  std::int64_t parameters() const { return weight_offset(layers()); }
  // Activations saved per row by the forward pass for the backward: every hidden unit's
  // pre-activation (the backward recomputes the activation from it).
  std::int64_t saved_per_row() const {
    std::int64_t n = 0;
    for (int h : hidden) n += h;
    return n;
  }
  int widest() const {
    int w = inputs;
    for (int h : hidden) w = h > w ? h : w;
    return w;
  }
  bool operator==(const MlpLayout&) const = default;
};

namespace math {

// The host-side argument checks both backends' mlp_forward / mlp_backward make.
inline void check_mlp_arguments(const MlpLayout& layout, const float* params, const float* x,
                                std::int64_t n, const char* op) {
  DC_CHECK(n >= 0, op, ": negative row count ", n);
  DC_CHECK(layout.inputs > 0 && !layout.hidden.empty(), op, ": empty layout");
  DC_CHECK(n == 0 || (params && x), op, ": null parameters or inputs");
}

// e^x, branch-free so that the CPU's loops over a tile of rows vectorise (glibc's expf is a call
// per element and took most of the MLP's time): k = round(x log2 e) (adding and subtracting
// 1.5 * 2^23 rounds to the nearest integer), r = x - k ln 2 in two steps (Cody-Waite, so r keeps
// its bits for large |x|), |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (truncation
// 1.2e-7 relative), 2^k put in the exponent bits. Relative error below 5e-7 against exp in double
// (tests/cpu/test_mlp_policy.cpp). The CUDA kernels use it too, so both backends compute the same
// activation (up to FMA contraction).
// exp_fast_in_range needs x in [-87, 88] (e^x a normal float); exp_fast clamps first. The CPU
// loops clamp in a loop of their own: GCC 12 does not vectorise the clamp and the rest together.
DC_HD float exp_input_clamp(float x) {
  x = x > -87.0f ? x : -87.0f;
  return x < 88.0f ? x : 88.0f;
}
DC_HD float exp_fast_in_range(float x) {
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;  // ln 2 = hi + lo
  constexpr float c2 = 0.5f, c3 = 1.0f / 6.0f, c4 = 1.0f / 24.0f, c5 = 1.0f / 120.0f, c6 = 1.0f / 720.0f;
  const float p = 1.0f + r * (1.0f + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * c6)))));
  const std::int32_t bits = (static_cast<std::int32_t>(k) + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
DC_HD float exp_fast(float x) { return exp_fast_in_range(exp_input_clamp(x)); }

// SiLU and its derivative given e^-z (the scalar functions and the vectorised loops share these).
DC_HD float silu_given_exp(float z, float exp_minus_z) { return z / (1.0f + exp_minus_z); }
DC_HD float silu_derivative_given_exp(float z, float exp_minus_z) {
  const float s = 1.0f / (1.0f + exp_minus_z);
  return s * (1.0f + z * (1.0f - s));
}

DC_HD float activate(Activation a, float x) {
  switch (a) {
    case Activation::silu: return silu_given_exp(x, exp_fast(-x));
    case Activation::tanh: return tanhf(x);
    case Activation::relu: return x > 0.0f ? x : 0.0f;
  }
  return x;
}

// d activate(x) / dx.
DC_HD float activate_derivative(Activation a, float x) {
  switch (a) {
    case Activation::silu: return silu_derivative_given_exp(x, exp_fast(-x));
    case Activation::tanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case Activation::relu: return x > 0.0f ? 1.0f : 0.0f;
  }
  return 1.0f;
}

// The activation of n values, and its backward dz[i] = g[i] * act'(z[i]); out and dz must not
// alias z. The switch is outside the loops, so the CPU's loops vectorise; they share the scalar
// functions' formulas (equal up to FMA contraction).
inline void activate_all(Activation a, const float* z, float* out, int n) {
  switch (a) {
    case Activation::silu:
      for (int i = 0; i < n; ++i) out[i] = exp_input_clamp(-z[i]);
      for (int i = 0; i < n; ++i) out[i] = silu_given_exp(z[i], exp_fast_in_range(out[i]));
      return;
    case Activation::tanh:
      for (int i = 0; i < n; ++i) out[i] = activate(Activation::tanh, z[i]);
      return;
    case Activation::relu:
      for (int i = 0; i < n; ++i) out[i] = activate(Activation::relu, z[i]);
      return;
  }
}

inline void activate_backward_all(Activation a, const float* z, const float* g, float* dz, int n) {
  switch (a) {
    case Activation::silu:
      for (int i = 0; i < n; ++i) dz[i] = exp_input_clamp(-z[i]);
      for (int i = 0; i < n; ++i) dz[i] = g[i] * silu_derivative_given_exp(z[i], exp_fast_in_range(dz[i]));
      return;
    case Activation::tanh:
      for (int i = 0; i < n; ++i) dz[i] = g[i] * activate_derivative(Activation::tanh, z[i]);
      return;
    case Activation::relu:
      for (int i = 0; i < n; ++i) dz[i] = g[i] * activate_derivative(Activation::relu, z[i]);
      return;
  }
}

}  // namespace math
}  // namespace dc
