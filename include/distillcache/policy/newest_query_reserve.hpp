#pragma once
// A share of every group's budget kept for the rows its layer's newest query attends to most
// (MlpPolicy's newest_query_reserve).
//
// Why a reserve and not an input weight: needle retrieval needs TOVA's signal (the newest
// query's mass, averaged over a layer's KV heads: layer_last_query_mass), continuation KL needs
// H2O's (mass accumulated over every query). A weight on the newest query's mass moves the whole
// ranking towards TOVA's, and every searched weight that kept needles cost continuation KL
// (bench/results/README.md). A reserve of R rows changes at most R of a group's choices: the
// R rows the newest query ranks first are kept, and they displace the R rows the score ranked
// last among those it kept. On text those top rows are mostly ones the score keeps anyway
// (attention sinks, the question's own recent context); on a needle prompt they are the needle.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../cpu/parallel.hpp"
#include "policy_inputs.hpp"

namespace dc {

// In every group of f, the `reserve` rows with the largest layer_last_query_mass among those
// whose score is finite (rows already scored +inf, a recent window, are kept anyway) score
// +inf. Ties go to the newer position, so the choice does not depend on row order or threads.
// A group with fewer finite rows than `reserve` has all of them raised.
inline void reserve_newest_query_rows(const TokenFeatures& f, int reserve, std::span<float> scores) {
  DC_CHECK(reserve >= 0, "newest-query reserve: negative row count ", reserve);
  DC_CHECK(scores.size() >= std::size_t(f.size), "newest-query reserve: ", scores.size(), " scores for ",
           f.size, " rows");
  if (reserve == 0 || f.size == 0) return;
  const std::vector<float> mass = layer_last_query_mass(f);
  const int groups = f.num_groups();
  DC_OMP(parallel for schedule(dynamic) if (groups > 1 && f.size > 4096))
  for (int g = 0; g < groups; ++g) {
    const FeatureGroup& group = f.groups[std::size_t(g)];
    std::vector<std::int32_t> rows;
    rows.reserve(std::size_t(group.rows()));
    for (int r = group.row_begin; r < group.row_end; ++r)
      if (scores[std::size_t(r)] != INFINITY) rows.push_back(r);
    const auto first_after = [&](std::int32_t a, std::int32_t b) {
      const float ma = mass[std::size_t(a)], mb = mass[std::size_t(b)];
      return ma != mb ? ma > mb : f.position[std::size_t(a)] > f.position[std::size_t(b)];
    };
    const std::size_t take = std::min(rows.size(), std::size_t(reserve));
    std::nth_element(rows.begin(), rows.begin() + std::ptrdiff_t(take), rows.end(), first_after);
    for (std::size_t i = 0; i < take; ++i) scores[std::size_t(rows[i])] = INFINITY;
  }
}

}  // namespace dc
