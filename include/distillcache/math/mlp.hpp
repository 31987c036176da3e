#pragma once
// The learned policy's MLP: its parameter layout and its activation, shared by both backends.
//
// inputs -> hidden[0] -> ... -> hidden[k-1] -> 1 score, an activation after every hidden layer,
// none after the last. All parameters live in one flat block (llm.c's layout), layer after
// layer: W_l [out_l, in_l] row-major, then b_l [out_l]; the offsets table below says where each
// starts, so an optimizer is one loop over the block.
#include <cmath>
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

DC_HD float activate(Activation a, float x) {
  switch (a) {
    case Activation::silu: return x / (1.0f + expf(-x));
    case Activation::tanh: return tanhf(x);
    case Activation::relu: return x > 0.0f ? x : 0.0f;
  }
  return x;
}

// d activate(x) / dx.
DC_HD float activate_derivative(Activation a, float x) {
  switch (a) {
    case Activation::silu: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case Activation::tanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case Activation::relu: return x > 0.0f ? 1.0f : 0.0f;
  }
  return 1.0f;
}

}  // namespace math
}  // namespace dc
