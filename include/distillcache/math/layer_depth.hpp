#pragma once
// Layers at the same relative depth in two models of different depths: how a policy's rules per
// layer (budget weights, the layers a newest-query rule applies to), written for the model it was
// trained on, apply to another model (zero-shot transfer, e.g. SmolLM2's 30 layers to Gemma 3's
// 18).
//
// Why by depth: what a layer does follows its place in the stack more than its index (SmolLM2
// retrieves in layers 18-20, 60-70 % of the way up; bench/results/README.md, "Retrieval
// layers"), and a fraction of the depth is the only coordinate two models share.
//
// The rule: layer l of a model of L layers covers [l, l + 1) / L of the depth; it takes the rule
// of the source layer whose centre is nearest its centre, s = round((l + 0.5) * S / L - 0.5),
// clamped to [0, S - 1]. Centres, not edges: the first and last layers map to the first and
// last, and a one-layer model takes the middle layer. Ties (a centre half-way between two
// source layers) go to the deeper one.
#include <algorithm>
#include <cmath>

#include "../core/error.hpp"

namespace dc::math {

inline int layer_at_same_depth(int layer, int layers, int source_layers) {
  DC_CHECK(layers > 0 && source_layers > 0, "layers at the same depth: layer counts ", layers, " and ",
           source_layers, " must be positive");
  DC_CHECK(layer >= 0 && layer < layers, "layers at the same depth: layer ", layer, " of a model of ", layers);
  const double centre = (double(layer) + 0.5) * double(source_layers) / double(layers) - 0.5;
  return std::clamp(int(std::floor(centre + 0.5)), 0, source_layers - 1);
}

}  // namespace dc::math
