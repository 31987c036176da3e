#pragma once
// Budgets per layer: how a total of budget x (evictable layers) slots is shared among the layers
// when some layers are worth more of it than others.
//
// Why: the KL an evicted cache costs is far from even across layers. On SmolLM2-135M (held-out
// Vim text, 1024 tokens, H2O at 25 % in one layer at a time, the others full) seven of the 30
// layers account for 80 % of the summed single-layer KL and half the layers for under 5 %. A
// uniform budget spends as many slots on a layer whose eviction costs nothing as on one whose
// eviction costs most of the KL.
//
// The rule: layer l gets a share proportional to its weight w_l > 0, capped at `cap` (the slots
// a layer holds: a layer cannot keep more than it has; what a capped layer cannot use goes to
// the others, again by weight) and floored at `floor` (the protected slots every layer must
// keep): clamp(level x w_l, floor, cap), at the level where the shares add up. Shares are
// rounded by largest remainder, so the budgets add up to exactly budget x evictable layers. Equal weights give every evictable
// layer exactly `budget`. Layers that are not evictable get 0 and take nothing.
//
// Host code: called once per eviction with one weight per layer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "../core/error.hpp"

namespace dc {

// Throws unless layer's weight is positive and finite (where: who is checking, for the message).
inline void check_layer_budget_weight(double weight, std::size_t layer, const char* where) {
  DC_CHECK(std::isfinite(weight) && weight > 0.0, where, ": the budget weight of layer ", layer, " is ", weight,
           "; weights must be positive and finite");
}
inline void check_layer_budget_weights(std::span<const double> weights, const char* where) {
  for (std::size_t l = 0; l < weights.size(); ++l) check_layer_budget_weight(weights[l], l, where);
}

// weights and evictable: one entry per layer (weights of non-evictable layers are ignored).
inline std::vector<int> allocate_layer_budgets(std::span<const double> weights,
                                               std::span<const char> evictable, int budget, int cap,
                                               int floor = 1) {
  const std::size_t layers = weights.size();
  DC_CHECK(evictable.size() == layers, "layer budgets: ", layers, " weights for ", evictable.size(), " layers");
  DC_CHECK(budget >= 0 && cap >= 0 && floor >= 0, "layer budgets: budget ", budget, ", cap ", cap,
           " and floor ", floor, " must be >= 0");
  DC_CHECK(budget <= cap, "layer budgets: a budget of ", budget, " exceeds the ", cap, " slots a layer holds");
  const int lo = std::min(floor, budget);  // a floor above the budget itself cannot be met
  std::vector<std::size_t> open;            // the evictable layers
  for (std::size_t l = 0; l < layers; ++l) {
    if (!evictable[l]) continue;
    check_layer_budget_weight(weights[l], l, "layer budgets");
    open.push_back(l);
  }
  std::vector<int> out(layers, 0);
  if (open.empty()) return out;
  const std::int64_t total = std::int64_t(budget) * std::int64_t(open.size());
  // The real shares are clamp(level * w_l, lo, cap) with the one level at which they add up to
  // the total (it exists: lo <= budget <= cap); the sum grows with the level, so bisect it.
  auto share = [&](std::size_t l, double level) { return std::clamp(level * weights[l], double(lo), double(cap)); };
  auto sum_at = [&](double level) {
    double s = 0.0;
    for (const std::size_t l : open) s += share(l, level);
    return s;
  };
  double low = 0.0, high = 1.0;
  while (sum_at(high) < double(total) && high < 1e300) high *= 2.0;
  for (int i = 0; i < 200 && low < high; ++i) {
    const double mid = 0.5 * (low + high);
    (sum_at(mid) < double(total) ? low : high) = mid;
  }
  // Integers by largest remainder: every layer its share rounded down, then one more slot to
  // the largest fractions (ties to the lower layer, so the result is deterministic) until the
  // total is met; a share below the cap rounds up to at most the cap.
  std::vector<double> fraction(layers, 0.0);
  std::int64_t given = 0;
  for (const std::size_t l : open) {
    const double s = share(l, high);
    out[l] = std::clamp(int(std::floor(s)), lo, cap);
    fraction[l] = s - double(out[l]);
    given += out[l];
  }
  std::vector<std::size_t> order = open;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return fraction[a] > fraction[b]; });
  for (std::size_t i = 0; given < total && i < order.size(); ++i)
    if (out[order[i]] < cap) {
      ++out[order[i]];
      ++given;
    }
  // The bisection's level errs by far less than a slot, so the floors never overshoot; should
  // they, take slots back from the smallest fractions above the floor.
  for (std::size_t i = order.size(); given > total && i-- > 0;)
    if (out[order[i]] > lo) {
      --out[order[i]];
      --given;
    }
  return out;
}

}  // namespace dc
