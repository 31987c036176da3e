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
#include "../cpu/parallel.hpp"
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

// In every group of f, the `reserve` rows with the largest layer_last_query_mass among those
// whose score is finite (rows already scored +inf, a recent window, are kept anyway) score
// +inf. Ties go to the newer position, so the choice does not depend on row order or threads.
// A group with fewer finite rows than `reserve` has all of them raised. With `layers` (sorted
// layer indices, parse_layer_list) only the groups inside those layers get a reserve.
inline void reserve_newest_query_rows(const TokenFeatures& f, int reserve, std::span<float> scores,
                                      std::span<const int> layers = {}) {
  DC_CHECK(reserve >= 0, "newest-query reserve: negative row count ", reserve);
  DC_CHECK(scores.size() >= std::size_t(f.size), "newest-query reserve: ", scores.size(), " scores for ",
           f.size, " rows");
  if (reserve == 0 || f.size == 0) return;
  DC_CHECK(layers.empty() || layers.back() < f.model_layers(), "newest-query rows: layer ", layers.back(),
           " named, the model has ", f.model_layers(), " layers");
  const std::vector<float> mass = layer_last_query_mass(f, layers);  // only the layers it ranks
  const int groups = f.num_groups();
  DC_OMP(parallel for schedule(dynamic) if (groups > 1 && f.size > 4096))
  for (int g = 0; g < groups; ++g) {
    const FeatureGroup& group = f.groups[std::size_t(g)];
    if (!group_in_layers(group, layers)) continue;
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
