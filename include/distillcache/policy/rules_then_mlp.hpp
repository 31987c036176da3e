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
#include <atomic>
#include <cstdint>
#include <exception>
#include <span>
#include <vector>

#include "../cache/features.hpp"
#include "../core/error.hpp"
#include "../cpu/parallel.hpp"
#include "mlp_scoring.hpp"
#include "newest_query_pins.hpp"
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

// The newest-query pins score_rules_then_mlp computes (newest_query_pinned_positions(f, count,
// guide)): none without guide layers or with a count of 0.
struct NewestQueryPinRule {
  std::span<const int> guide;
  int count = 0;
};

// pins: the positions mark_forced_rows keeps with the recent window; reserves: as
// reserve_newest_query_rows takes them (they skip the newest-query groups); mlp: the MLP (built
// for f). A single group (shared granularity) goes step by step instead, where the MLP's tiles
// spread over every thread.
//
// The pins are computed inside the pass, by the first thread free, while the others score the
// layers that read none (those whose every group takes the newest query's keep-set): computed
// before the pass, they kept every other thread waiting (about 10 us at B = 512 of 2048).
inline void score_rules_then_mlp(const TokenFeatures& f, int recent, NewestQueryPinRule pins,
                                 std::span<const NewestQueryReserve> reserves, NewestQueryGroups newest,
                                 const OpenRowScorer& mlp, std::span<float> scores) {
  DC_CHECK(scores.size() >= std::size_t(f.size), "mlp policy: ", scores.size(), " scores for ", f.size, " rows");
  DC_CHECK(recent >= 0, "mlp policy: negative recent window ", recent);
  DC_CHECK(newest.flags.empty() || newest.flags.size() == f.groups.size(), "mlp policy: ", newest.flags.size(),
           " newest-query group flags for ", f.groups.size(), " groups");
  DC_CHECK(newest.rows >= 0, "mlp policy: negative newest-query row count ", newest.rows);
  const LayerRanges ranges = layer_range_groups(f, {});
  const std::vector<int> reserve_rows = reserve_rows_by_range(f, ranges, reserves);
  const auto all_newest = [&](const LayerRangeGroups& range) {
    return std::all_of(range.groups.begin(), range.groups.end(), [&](int g) { return newest.has(g); });
  };
  // The ranges no pin reads (every group the newest query's), scored while the pins are
  // computed, and the others.
  std::vector<int> unpinned, pinned_ranges;
  for (std::size_t r = 0; r < ranges.size(); ++r) (all_newest(ranges[r]) ? unpinned : pinned_ranges).push_back(int(r));
  // Each thread starts on the ranges of its contiguous share of the rows (cpu_detail::
  // contiguous_share), where the gather of the features and their check left them in its core's
  // cache (handed out dynamically, largest first, the pass read most rows from the other core),
  // and once they are done takes the last range of the nearest thread's share not yet taken
  // (cpu_detail::ContiguousRuns): the layers with a reserve cost about twice as much per row as
  // the others. A range's rows: from its first group's first row to its last group's last.
  const int threads = cpu_detail::max_threads();
  std::vector<int> owner(pinned_ranges.size());
  for (std::size_t i = 0; i < pinned_ranges.size(); ++i) {
    std::int64_t begin = f.size, end = 0;
    for (int g : ranges[std::size_t(pinned_ranges[i])].groups) {
      begin = std::min<std::int64_t>(begin, f.groups[std::size_t(g)].row_begin);
      end = std::max<std::int64_t>(end, f.groups[std::size_t(g)].row_end);
    }
    owner[i] = cpu_detail::contiguous_share(begin, end, f.size, threads);
    // (ranges come in the order of their first group and their groups are written together,
    // so this only guards against features gathered otherwise)
    if (i > 0) owner[i] = std::max(owner[i], owner[i - 1]);
  }
  cpu_detail::ContiguousRuns runs(owner, threads);

  // One range's rules and MLP (forced: the window and the pins; unread where every group is the
  // newest query's). False where a row's position is outside [0, latest].
  const auto score_range = [&](const LayerRangeGroups& range, int rows, const detail::ForcedRows* forced,
                               std::vector<std::int32_t>& pin, detail::ReserveScratch& reserve,
                               OpenRowScorer::Scratch& scratch) {
    const bool any_newest = newest.rows > 0 && std::any_of(range.groups.begin(), range.groups.end(),
                                                           [&](int g) { return newest.has(g); });
    const bool ranked = rows > 0 && !all_newest(range);
    if ((ranked || any_newest) && !layer_mean_newest_query_mass(f, range, reserve.mean)) return false;
    for (int g : range.groups) {
      const FeatureGroup& group = f.groups[std::size_t(g)];
      if (newest.has(g)) {
        std::fill(scores.begin() + group.row_begin, scores.begin() + group.row_end, 0.0f);
        if (newest.rows > 0) detail::raise_top_mass_rows(f, group, reserve.mean, newest.rows, scores, reserve);
        continue;
      }
      forced->mark_group(f, g, pin, scores);
      if (ranked) detail::raise_top_mass_rows(f, group, reserve.mean, rows, scores, reserve);
      mlp.score_group(g, scratch, scores);
    }
    return true;
  };

  std::vector<char> pinned;
  std::exception_ptr pin_error;  // nothing may leave a parallel region by an exception
  std::atomic<int> next_first{0};
  const int first_items = 1 + int(unpinned.size());  // item 0: the pins
  int bad = 0;
  DC_OMP(parallel reduction(| : bad) if (ranges.size() > 1 && f.size > 4096))
  {
    std::vector<std::int32_t> pin;
    detail::ReserveScratch reserve;
    OpenRowScorer::Scratch scratch = mlp.scratch();
    for (int i = next_first.fetch_add(1); i < first_items; i = next_first.fetch_add(1)) {
      if (i == 0) {
        try {
          pinned = newest_query_pinned_positions(f, pins.count, pins.guide);
        } catch (...) {
          pin_error = std::current_exception();
        }
      } else {
        const int r = unpinned[std::size_t(i - 1)];
        if (!score_range(ranges[std::size_t(r)], reserve_rows[std::size_t(r)], nullptr, pin, reserve, scratch))
          bad |= 1;
      }
    }
    DC_OMP(barrier)  // the pins are in
    if (!pin_error) {
      const detail::ForcedRows forced(f, recent, pinned);
      const int thread = cpu_detail::thread_num();
      for (int k = runs.next(thread); k >= 0; k = runs.next(thread)) {
        const int r = pinned_ranges[std::size_t(k)];
        if (!score_range(ranges[std::size_t(r)], reserve_rows[std::size_t(r)], &forced, pin, reserve, scratch))
          bad |= 1;
      }
    }
  }
  if (pin_error) std::rethrow_exception(pin_error);
  if (bad) check_layer_range_positions(f, ranges);
}

}  // namespace dc
