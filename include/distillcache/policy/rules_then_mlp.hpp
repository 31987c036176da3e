#pragma once
// MlpPolicy's scoring at head or layer granularity in one pass over the layers: for each layer,
// its mean newest-query mass where a reserve ranks it, then for each of its groups the forced
// rows (mark_forced_rows), the reserve's rows (reserve_newest_query_rows) and the MLP on the rows
// left open (mlp_score_open_rows). The same scores as those three one after the other (each step
// reads only its own group's rows and the layer's mass, never another group's scores), for
// less memory traffic: at SmolLM2's 8k cache one pass over every row's features and scores
// streams megabytes from the last-level cache, and the steps one after the other made four such
// passes, where a layer's rows (a few hundred kilobytes) stay in the core's own cache from one
// step to the next.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../cache/features.hpp"
#include "../core/error.hpp"
#include "../cpu/parallel.hpp"
#include "mlp_scoring.hpp"
#include "newest_query_reserve.hpp"
#include "policy_inputs.hpp"

namespace dc {

// pinned, unscored: as mark_forced_rows takes them; reserves: as reserve_newest_query_rows
// takes them; mlp: the MLP (built for f). A single group (shared granularity) goes step by
// step instead, where the MLP's tiles spread over every thread.
inline void score_rules_then_mlp(const TokenFeatures& f, int recent, std::span<const char> pinned,
                                 std::span<const NewestQueryReserve> reserves, std::span<const char> unscored,
                                 const OpenRowScorer& mlp, std::span<float> scores) {
  DC_CHECK(scores.size() >= std::size_t(f.size), "mlp policy: ", scores.size(), " scores for ", f.size, " rows");
  DC_CHECK(recent >= 0, "mlp policy: negative recent window ", recent);
  DC_CHECK(unscored.empty() || unscored.size() == f.groups.size(), "mlp policy: ", unscored.size(),
           " group flags for ", f.groups.size(), " groups");
  const std::vector<LayerRangeGroups> ranges = layer_range_groups(f, {});
  const std::vector<int> reserve_rows = reserve_rows_by_range(f, ranges, reserves);
  const int num_ranges = int(ranges.size());
  int bad = 0;
  DC_OMP(parallel if (num_ranges > 1 && f.size > 4096))
  {
    const detail::ForcedRows forced(f, recent, pinned);
    std::vector<std::int32_t> pin;
    detail::ReserveScratch reserve;
    OpenRowScorer::Scratch scratch = mlp.scratch();
    DC_OMP(for schedule(dynamic) reduction(| : bad))
    for (int r = 0; r < num_ranges; ++r) {
      const LayerRangeGroups& range = ranges[std::size_t(r)];
      const int rows = reserve_rows[std::size_t(r)];
      const auto is_unscored = [&](int g) { return !unscored.empty() && unscored[std::size_t(g)] != 0; };
      const bool ranked = rows > 0 && !std::all_of(range.groups.begin(), range.groups.end(), is_unscored);
      if (ranked && !layer_mean_newest_query_mass(f, range, reserve.mean)) {
        bad |= 1;
        continue;
      }
      for (int g : range.groups) {
        if (is_unscored(g)) {
          std::fill(scores.begin() + f.groups[std::size_t(g)].row_begin, scores.begin() + f.groups[std::size_t(g)].row_end,
                    0.0f);
          continue;
        }
        forced.mark_group(f, g, pin, scores);
        if (ranked) detail::raise_top_mass_rows(f, f.groups[std::size_t(g)], reserve.mean, rows, scores, reserve);
        mlp.score_group(g, scratch, scores);
      }
    }
  }
  if (bad) check_layer_range_positions(f, ranges);
}

}  // namespace dc
