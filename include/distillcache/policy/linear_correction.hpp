#pragma once
// A score that is a linear function of the policy's inputs, w . x, carried exactly by a ReLU MLP
// so that it is an ordinary policy everywhere (checkpoint, scoring kernels, eval, REINFORCE on
// top). On the H2O score base it is a correction of H2O's log accumulated mass: w = 0 is H2O
// itself, and e.g. w on value_norm = 1 scores log(mass) + log(relative value norm), attention
// times value norm.
//
// The network passes the value through two units per hidden layer, the positive and negative
// parts: u = relu(w . x), v = relu(-w . x) in the first layer, then relu(u) = u and relu(v) = v
// in every later one, and the output is u - v = w . x. Every other weight and bias is zero. No
// offset is needed, so the score keeps float's full resolution (an offset c would round w . x
// to c's ulp), and the rounding is only that of w . x itself.
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/finite.hpp"
#include "../math/mlp.hpp"

namespace dc {

inline void check_linear_layout(const MlpLayout& layout) {
  DC_CHECK(layout.activation == Activation::relu, "linear correction: the MLP must use ReLU (",
           "it carries w . x as relu(w . x) - relu(-w . x))");
  for (int h : layout.hidden)
    DC_CHECK(h >= 2, "linear correction: every hidden layer needs at least 2 units, one has ", h);
}

// The parameter block of `layout` that computes w . x (w: one weight per input).
inline std::vector<float> linear_correction_params(const MlpLayout& layout, std::span<const float> w) {
  check_linear_layout(layout);
  DC_CHECK(int(w.size()) == layout.inputs, "linear correction: ", w.size(), " weights for ",
           layout.inputs, " inputs");
  check_all_finite(w, "linear correction: weights");
  std::vector<float> p(std::size_t(layout.parameters()), 0.0f);
  const auto at = [&](int l, int out, int in) -> float& {
    return p[std::size_t(layout.weight_offset(l) + std::int64_t(out) * layout.in(l) + in)];
  };
  for (int i = 0; i < layout.inputs; ++i) {
    at(0, 0, i) = w[std::size_t(i)];
    at(0, 1, i) = -w[std::size_t(i)];
  }
  const int last = layout.layers() - 1;
  for (int l = 1; l < last; ++l) {
    at(l, 0, 0) = 1.0f;
    at(l, 1, 1) = 1.0f;
  }
  at(last, 0, 0) = 1.0f;
  at(last, 0, 1) = -1.0f;
  return p;
}

// The weights w of a block written by linear_correction_params (reads the first layer's unit 0).
inline std::vector<float> linear_correction_weights(const MlpLayout& layout, std::span<const float> params) {
  check_linear_layout(layout);
  DC_CHECK(std::int64_t(params.size()) == layout.parameters(), "linear correction: ", params.size(),
           " parameters for an MLP of ", layout.parameters());
  const auto first = params.begin() + std::ptrdiff_t(layout.weight_offset(0));
  return std::vector<float>(first, first + layout.inputs);
}

// Whether `params` is exactly the block linear_correction_params writes for some w (its first
// layer's unit 0): then the network's output is that unit's pre-activation, w . x, to the bit
// (the negative unit's pre-activation is its exact negation, each later layer passes both
// through unchanged, the output adds one of them to zero), which inference computes alone.
inline bool is_linear_correction(const MlpLayout& layout, std::span<const float> params) {
  if (layout.activation != Activation::relu || std::int64_t(params.size()) != layout.parameters()) return false;
  for (int h : layout.hidden)
    if (h < 2) return false;
  const std::vector<float> w = linear_correction_weights(layout, params);
  for (float x : w)
    if (!std::isfinite(x)) return false;
  const std::vector<float> expected = linear_correction_params(layout, w);
  for (std::size_t i = 0; i < expected.size(); ++i)  // bits, not values: a -0 weight is not the block's +0
    if (std::bit_cast<std::uint32_t>(expected[i]) != std::bit_cast<std::uint32_t>(params[i])) return false;
  return true;
}

}  // namespace dc
