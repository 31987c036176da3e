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
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../core/parse_text.hpp"
#include "../cpu/gather_pack.hpp"
#include "../cpu/parallel.hpp"
#include "../cpu/radix_select.hpp"
#include "../math/plackett_luce.hpp"
#include "../math/budget_schedule.hpp"
#include "layer_lists.hpp"
#include "policy_inputs.hpp"

namespace dc {

// A reserve's shares by budget fraction (math/budget_schedule.hpp): empty (no reserve), or
// fractions strictly increasing in (0, 1] and shares in [0, 1). Throws naming the first problem
// and `what` the schedule is for (the pins take the same format).
inline void check_reserve_schedule(std::span<const SchedulePoint> points, const char* what = "newest-query reserve") {
  for (std::size_t i = 0; i < points.size(); ++i) {
    const SchedulePoint p = points[i];
    DC_CHECK(std::isfinite(p.fraction) && p.fraction > 0.0 && p.fraction <= 1.0, what, ": budget fraction ",
             p.fraction, " outside (0, 1]");
    DC_CHECK(std::isfinite(p.share) && p.share >= 0.0 && p.share < 1.0, what, ": share ", p.share, " outside [0, 1)");
    DC_CHECK(i == 0 || p.fraction > points[i - 1].fraction, what, ": budget fractions must increase, ", p.fraction,
             " follows ", points[i - 1].fraction);
  }
}

inline double max_reserve_share(std::span<const SchedulePoint> points) {
  double m = 0.0;
  for (const SchedulePoint& p : points) m = std::max(m, p.share);
  return m;
}

// The schedule as parse_reserve_schedule reads it: "0" (none), "0.25" (one share), or
// "0.125:0,0.25:0.25" (points).
inline std::string describe_reserve_schedule(std::span<const SchedulePoint> points) {
  if (points.empty()) return "0";
  std::ostringstream out;  // appends only: GCC 12 warns (-Wrestrict) on "," + std::string
  if (points.size() == 1 && points[0].fraction == 1.0) {
    out << points[0].share;
    return out.str();
  }
  for (std::size_t i = 0; i < points.size(); ++i) out << (i ? "," : "") << points[i].fraction << ':' << points[i].share;
  return out.str();
}

// "0.25" (the same share at every budget) or "0.125:0,0.25:0.25,0.5:0.375" (budget fraction:share
// points, linear in between). "0" is no reserve.
inline std::vector<SchedulePoint> parse_reserve_schedule(std::string_view text, const char* what = "newest-query reserve") {
  auto number = [&](std::string_view s) {
    const auto v = whole_double(s);
    DC_CHECK(v.has_value(), what, " '", std::string(text), "': '", std::string(s), "' is not a number");
    return *v;
  };
  std::vector<SchedulePoint> points;
  if (text.find(':') == std::string_view::npos) {
    const double share = number(text);
    if (share != 0.0) points.push_back({1.0, share});
  } else {
    for (const std::string_view item : comma_items(text)) {
      const std::size_t colon = item.find(':');
      DC_CHECK(colon != std::string_view::npos, what, " '", std::string(text), "': '", std::string(item),
               "' is not FRACTION:SHARE");
      points.push_back({number(item.substr(0, colon)), number(item.substr(colon + 1))});
    }
  }
  check_reserve_schedule(points, what);
  return points;
}

namespace detail {

// Scratch a thread reuses from group to group.
struct ReserveScratch {
  std::vector<float> mean;                        // by position
  std::vector<float> row_mass;                    // per row of a group
  std::vector<std::uint32_t> row_keys, keys, spare;  // per row of a group
  std::vector<std::int32_t> tied;
};

// Raises to +inf the `count` rows of `group` with the largest mass (mean[position]) among those
// not already +inf, ties to the newer position; every such row if fewer. By threshold, not by
// ordering rows: the count-th largest mass is found by radix selection on the masses' order bits
// (cpu/radix_select.hpp), every row above it is raised, and only where some rows equal to it
// are left out are those ordered, by position. The same rows as sorting them all by (mass,
// position): with nth_element and a comparator loading both, sorting was most of the reserve's
// cost (bench_eviction, shape 9). The loops over rows have no data-dependent branch (a raised
// row is as likely as not: every branch on it was a coin flip for the predictor).
inline void raise_top_mass_rows(const TokenFeatures& f, const FeatureGroup& group, std::span<const float> mean,
                                int count, std::span<float> scores, ReserveScratch& s) {
  const int rows = group.rows();
  const std::int32_t* DC_RESTRICT position = f.position.data() + group.row_begin;
  float* DC_RESTRICT score = scores.data() + group.row_begin;
  const float* DC_RESTRICT by_position = mean.data();
  s.row_keys.resize(std::size_t(rows));
  s.keys.resize(std::size_t(rows));
  s.spare.resize(std::size_t(rows));
  std::uint32_t* DC_RESTRICT row_key = s.row_keys.data();
  s.row_mass.resize(std::size_t(rows));
  const float* DC_RESTRICT row_mass = s.row_mass.data();
  cpu_detail::gather(by_position, position, rows, s.row_mass.data());
  for (int i = 0; i < rows; ++i) row_key[i] = math::float_order_bits(row_mass[i]);  // vectorised
  // the keys of rows not yet +inf, packed
  const std::size_t eligible = std::size_t(cpu_detail::pack_values_not_inf(row_key, score, rows, s.keys.data()));
  const std::size_t take = std::min(eligible, std::size_t(count));
  if (take == 0) return;
  if (take == eligible) {
    std::fill(score, score + rows, INFINITY);
    return;
  }
  const cpu_detail::KthLargestKey kth = cpu_detail::kth_largest_key(s.keys.data(), s.spare.data(), eligible, take);
  const std::uint32_t threshold = kth.key;
  if (kth.taken == kth.equal) {  // every row at the threshold is in: no order needed (a +inf row stays +inf)
    for (int i = 0; i < rows; ++i) score[i] = row_key[i] >= threshold ? INFINITY : score[i];
    return;
  }
  s.tied.clear();  // the free rows at the threshold, of which the newest kth.taken are raised
  for (int i = 0; i < rows; ++i)
    if (row_key[i] == threshold && score[i] != INFINITY) s.tied.push_back(i);
  for (int i = 0; i < rows; ++i) score[i] = row_key[i] > threshold ? INFINITY : score[i];
  std::nth_element(s.tied.begin(), s.tied.begin() + std::ptrdiff_t(kth.taken), s.tied.end(),
                   [&](std::int32_t a, std::int32_t b) { return position[a] > position[b]; });
  for (std::size_t i = 0; i < kth.taken; ++i) score[s.tied[i]] = INFINITY;
}

}  // namespace detail

// Throws where sorted `layers` name a layer past f's model (the reserves' and the newest-query
// layers' lists).
inline void check_newest_query_layers(const TokenFeatures& f, std::span<const int> layers) {
  DC_CHECK(layers.empty() || layers.back() < f.model_layers(), "newest-query rows: layer ", layers.back(),
           " named, the model has ", f.model_layers(), " layers");
}

// One reserve: `rows` rows per group in the groups inside `layers` (sorted layer indices,
// parse_layer_list; empty: every layer).
struct NewestQueryReserve {
  std::span<const int> layers;
  int rows = 0;
};

// The rows each of `ranges` (layer_range_groups(f, {})) reserves under `reserves`: those of the
// reserve whose layers hold the range, 0 where none does. Throws naming the problem where a
// reserve is negative, names a layer past the model, or two reserves rank one range.
inline std::vector<int> reserve_rows_by_range(const TokenFeatures& f, std::span<const LayerRangeGroups> ranges,
                                              std::span<const NewestQueryReserve> reserves) {
  std::vector<int> rows(ranges.size(), 0);
  for (const NewestQueryReserve& reserve : reserves) {
    DC_CHECK(reserve.rows >= 0, "newest-query reserve: negative row count ", reserve.rows);
    if (reserve.rows == 0 || f.size == 0) continue;
    check_newest_query_layers(f, reserve.layers);
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (!group_in_layers(f.groups[std::size_t(ranges[r].groups.front())], reserve.layers)) continue;
      DC_CHECK(rows[r] == 0, "newest-query reserve: two reserves rank layers ", ranges[r].layer_begin, "-",
               ranges[r].layer_end - 1);
      rows[r] = reserve.rows;
    }
  }
  return rows;
}

// Several reserves at once, in layers no two of them share (MlpPolicy's reserve layers and the
// reserve elsewhere): one pass over the layers in parallel, where one call per reserve left a
// thread idle whenever a reserve covered fewer layers than threads could share evenly (three
// layers on two threads). Each works as the one-reserve form below.
inline void reserve_newest_query_rows(const TokenFeatures& f, std::span<const NewestQueryReserve> reserves,
                                      std::span<float> scores, std::span<const char> skipped = {}) {
  DC_CHECK(scores.size() >= std::size_t(f.size), "newest-query reserve: ", scores.size(), " scores for ",
           f.size, " rows");
  DC_CHECK(skipped.empty() || skipped.size() == f.groups.size(), "newest-query reserve: ", skipped.size(),
           " group flags for ", f.groups.size(), " groups");
  const LayerRanges ranges = layer_range_groups(f, {});
  const std::vector<int> rows = reserve_rows_by_range(f, ranges, reserves);
  std::vector<int> ranked;  // the ranges some reserve ranks and not every group of which is skipped
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const bool all_skipped = !skipped.empty() && std::all_of(ranges[r].groups.begin(), ranges[r].groups.end(),
                                                             [&](int g) { return skipped[std::size_t(g)] != 0; });
    if (rows[r] > 0 && !all_skipped) ranked.push_back(int(r));
  }
  const int num_ranked = int(ranked.size());
  if (num_ranked == 0) return;
  int bad = 0;
  DC_OMP(parallel if (num_ranked > 1 && f.size > 4096))
  {
    detail::ReserveScratch scratch;
    DC_OMP(for schedule(dynamic) reduction(| : bad))
    for (int i = 0; i < num_ranked; ++i) {
      const std::size_t r = std::size_t(ranked[std::size_t(i)]);
      if (!layer_mean_newest_query_mass(f, ranges[r], scratch.mean)) {
        bad |= 1;
        continue;
      }
      for (int g : ranges[r].groups)
        if (skipped.empty() || !skipped[std::size_t(g)])
          detail::raise_top_mass_rows(f, f.groups[std::size_t(g)], scratch.mean, rows[r], scores, scratch);
    }
  }
  if (bad) check_layer_range_positions(f, ranges);
}

// In every group of f, the `reserve` rows with the largest layer_last_query_mass among those
// whose score is not +inf (rows already scored +inf, a recent window, are kept anyway) score
// +inf. Ties go to the newer position, so the choice does not depend on row order or threads.
// A group with fewer such rows than `reserve` has all of them raised. With `layers` (sorted
// layer indices, parse_layer_list) only the groups inside those layers get a reserve. Layer by
// layer: the mass by position is computed once for a layer's KV heads. skipped: empty, or a
// flag per group; flagged groups are left as they are (MlpPolicy's newest-query layers, which it
// rescores whole afterwards), and a layer whose groups are all flagged is not looked at.
inline void reserve_newest_query_rows(const TokenFeatures& f, int reserve, std::span<float> scores,
                                      std::span<const int> layers = {}, std::span<const char> skipped = {}) {
  const NewestQueryReserve one{layers, reserve};
  reserve_newest_query_rows(f, std::span<const NewestQueryReserve>(&one, 1), scores, skipped);
}

// MlpPolicy's newest_query_layers: in the groups inside `layers`, the `budget` rows with the
// largest layer_last_query_mass score +inf and every other row 0, whatever the score, the recent
// window or the reserve chose there (TOVA's keep-set at the layer level). No-op without layers.
// `budget` is the policy's nominal one: where layer budget weights give such a layer more, the
// extra slots go to the 0-scored rows, newest first (as ties break).
inline void give_layers_to_newest_query(const TokenFeatures& f, int budget, std::span<const int> layers,
                                        std::span<float> scores) {
  if (layers.empty() || f.size == 0) return;
  for (const FeatureGroup& g : f.groups)
    if (group_in_layers(g, layers)) std::fill(scores.begin() + g.row_begin, scores.begin() + g.row_end, 0.0f);
  reserve_newest_query_rows(f, budget, scores, layers);
}

}  // namespace dc
