#pragma once
// MlpPolicy's scoring at head or layer granularity in one pass over the layers: for each layer,
// its mean newest-query mass where a reserve or the newest-query rule reads it, then for each of
// its groups either the newest query's whole keep-set (give_layers_to_newest_query's rule) or the
// forced rows (mark_forced_rows), the reserve's rows (reserve_newest_query_rows) and the MLP on
// the rows left open (mlp_score_open_rows). The same scores as those steps one after the other
// (each step reads only its own group's rows and the layer's mass, never another group's scores),
// for less memory traffic: at SmolLM2's 8k cache one pass over every row's features and scores
// streams megabytes from the last-level cache, and the steps one after the other made five such
// passes, where a layer's rows (a few hundred kilobytes) stay in the core's own cache from one
// step to the next. At B = 512 of 2048 the newest-query layers alone, as a pass of their own,
// cost a fifth of what v10's scoring adds to H2O's.
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

// The groups whose whole keep-set goes to their layer's newest query (MlpPolicy's newest-query
// layers): a flag per group (empty: none; flag whole layers, as group_in_layers does), and the
// rows each keeps (give_layers_to_newest_query's budget; the others score 0).
struct NewestQueryGroups {
  std::span<const char> flags;
  int rows = 0;
  bool has(int g) const { return !flags.empty() && flags[std::size_t(g)] != 0; }
};

// pinned: as mark_forced_rows takes it; reserves: as reserve_newest_query_rows takes them (they
// skip the newest-query groups); mlp: the MLP (built for f). A single group (shared granularity)
// goes step by step instead, where the MLP's tiles spread over every thread.
inline void score_rules_then_mlp(const TokenFeatures& f, int recent, std::span<const char> pinned,
                                 std::span<const NewestQueryReserve> reserves, NewestQueryGroups newest,
                                 const OpenRowScorer& mlp, std::span<float> scores) {
  DC_CHECK(scores.size() >= std::size_t(f.size), "mlp policy: ", scores.size(), " scores for ", f.size, " rows");
  DC_CHECK(recent >= 0, "mlp policy: negative recent window ", recent);
  DC_CHECK(newest.flags.empty() || newest.flags.size() == f.groups.size(), "mlp policy: ", newest.flags.size(),
           " newest-query group flags for ", f.groups.size(), " groups");
  DC_CHECK(newest.rows >= 0, "mlp policy: negative newest-query row count ", newest.rows);
  const LayerRanges ranges = layer_range_groups(f, {});
  const std::vector<int> reserve_rows = reserve_rows_by_range(f, ranges, reserves);
  const int num_ranges = int(ranges.size());
  // Each thread takes the ranges of its contiguous share of the rows (cpu_detail::
  // contiguous_share), where the gather of the features and their check left them in its core's
  // cache: handed out dynamically (largest first), the pass read most rows from the other core.
  // A range's rows: from its first group's first row to its last group's last.
  std::vector<std::int64_t> range_begin(ranges.size()), range_end(ranges.size());
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    range_begin[r] = f.size;
    for (int g : ranges[r].groups) {
      range_begin[r] = std::min<std::int64_t>(range_begin[r], f.groups[std::size_t(g)].row_begin);
      range_end[r] = std::max<std::int64_t>(range_end[r], f.groups[std::size_t(g)].row_end);
    }
  }
  int bad = 0;
  DC_OMP(parallel reduction(| : bad) if (num_ranges > 1 && f.size > 4096))
  {
    const detail::ForcedRows forced(f, recent, pinned);
    std::vector<std::int32_t> pin;
    detail::ReserveScratch reserve;
    OpenRowScorer::Scratch scratch = mlp.scratch();
    const int thread = cpu_detail::thread_num(), threads = cpu_detail::num_threads();
    for (int r = 0; r < num_ranges; ++r) {
      if (cpu_detail::contiguous_share(range_begin[std::size_t(r)], range_end[std::size_t(r)], f.size, threads) !=
          thread)
        continue;
      const LayerRangeGroups& range = ranges[std::size_t(r)];
      const int rows = reserve_rows[std::size_t(r)];
      const bool any_newest = newest.rows > 0 && std::any_of(range.groups.begin(), range.groups.end(),
                                                             [&](int g) { return newest.has(g); });
      const bool ranked = rows > 0 && !std::all_of(range.groups.begin(), range.groups.end(),
                                                   [&](int g) { return newest.has(g); });
      if ((ranked || any_newest) && !layer_mean_newest_query_mass(f, range, reserve.mean)) {
        bad |= 1;
        continue;
      }
      for (int g : range.groups) {
        const FeatureGroup& group = f.groups[std::size_t(g)];
        if (newest.has(g)) {
          std::fill(scores.begin() + group.row_begin, scores.begin() + group.row_end, 0.0f);
          if (newest.rows > 0) detail::raise_top_mass_rows(f, group, reserve.mean, newest.rows, scores, reserve);
          continue;
        }
        forced.mark_group(f, g, pin, scores);
        if (ranked) detail::raise_top_mass_rows(f, group, reserve.mean, rows, scores, reserve);
        mlp.score_group(g, scratch, scores);
      }
    }
  }
  if (bad) check_layer_range_positions(f, ranges);
}

}  // namespace dc
