#pragma once
// Positions kept in every layer because a few guide layers' newest query attends to them most
// (MlpPolicy's newest_query_pins).
//
// Why: on SmolLM2's single-needle prompts at 25 % the shipped v9 keeps the needle in its
// retrieval layers (TOVA's rule in layers 18 and 21) and still answers only the number's first
// digits about one time in four; TOVA, which answers nearly every one, keeps the needle in every
// layer from 14 on, v9 in few of them (bench/results/README.md, "v10 shipped"). Giving more layers
// to the newest query costs text KL in each of them; a pin costs a layer at most the pinned
// rows, and on text the positions a retrieval layer's newest query ranks first are mostly recent
// ones (kept by the recent window anyway) where on a needle prompt they are the needle. One set
// of positions for every layer, chosen where the needle stands out (the guide layers), rather
// than each layer's own ranking (the reserve), where in most layers it does not.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../cache/features.hpp"
#include "../cpu/radix_select.hpp"
#include "../math/plackett_luce.hpp"
#include "layer_lists.hpp"
#include "policy_inputs.hpp"

namespace dc {

// Per position in [0, latest_position]: the newest query's mass averaged over every KV head of
// the groups inside `guide` (sorted layer indices; a head that evicted a position counts 0 for
// it). A shared group covers every layer and counts only when `guide` names them all.
inline std::vector<float> guide_query_mass(const TokenFeatures& f, std::span<const int> guide) {
  DC_CHECK(f.latest_position >= -1, "newest-query pins: latest position ", f.latest_position);
  std::vector<double> sum(std::size_t(f.latest_position + 1), 0.0);
  double heads = 0.0;
  for (const FeatureGroup& g : f.groups) {
    if (!group_in_layers(g, guide)) continue;
    // last_query_mass is the mean over the group's heads and layers: weighted by their count.
    const double weight = double(g.head_end - g.head_begin) * double(g.layer_end - g.layer_begin);
    heads += weight;
    for (int r = g.row_begin; r < g.row_end; ++r) {
      const int p = f.position[std::size_t(r)];
      DC_CHECK(p >= 0 && p <= f.latest_position, "newest-query pins: row ", r, " has position ", p,
               " outside [0, ", f.latest_position, "]");
      sum[std::size_t(p)] += weight * double(f.last_query_mass[std::size_t(r)]);
    }
  }
  std::vector<float> mass(sum.size(), 0.0f);
  if (heads > 0.0)
    for (std::size_t p = 0; p < sum.size(); ++p) mass[p] = float(sum[p] / heads);
  return mass;
}

// A flag per position: the `count` positions of largest mass (ties to the newer position, so
// the choice does not depend on the order rows come in), every position if count exceeds them.
// By radix selection of the count-th largest mass (cpu/radix_select.hpp), as the reserve.
inline std::vector<char> pinned_positions(std::span<const float> mass, int count) {
  DC_CHECK(count >= 0, "newest-query pins: negative count ", count);
  const std::size_t n = mass.size(), take = std::min(n, std::size_t(count));
  std::vector<char> pinned(n, take == n ? 1 : 0);
  if (take == 0 || take == n) return pinned;
  std::vector<std::uint32_t> order_bits(n), keys(n), spare(n);
  for (std::size_t p = 0; p < n; ++p) order_bits[p] = math::float_order_bits(mass[p]);
  keys = order_bits;
  const cpu_detail::KthLargestKey kth = cpu_detail::kth_largest_key(keys.data(), spare.data(), n, take);
  for (std::size_t p = 0; p < n; ++p) pinned[p] = order_bits[p] > kth.key ? 1 : 0;
  std::size_t left = kth.taken;  // of the positions at the threshold, the newest
  for (std::size_t p = n; p-- > 0 && left > 0;)
    if (order_bits[p] == kth.key) {
      pinned[p] = 1;
      --left;
    }
  return pinned;
}

// The flags of pinned_positions for the `count` positions the `guide` layers' newest query
// attends to most; empty (nothing pinned) without guide layers, rows or pins.
inline std::vector<char> newest_query_pinned_positions(const TokenFeatures& f, int count, std::span<const int> guide) {
  if (guide.empty() || f.size == 0) return {};
  DC_CHECK(guide.back() < f.model_layers(), "newest-query pins: guide layer ", guide.back(), " named, the model has ",
           f.model_layers(), " layers");
  if (count == 0) return {};
  return pinned_positions(guide_query_mass(f, guide), count);
}

}  // namespace dc
