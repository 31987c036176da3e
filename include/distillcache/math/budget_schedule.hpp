#pragma once
// A share of the budget that depends on how large the budget is: the share at a budget fraction
// (kept rows over the context's tokens) is piecewise linear between (fraction, share) points and
// constant beyond the first and the last. The newest-query reserve uses it
// (policy/newest_query_reserve.hpp): what a share of the budget costs in continuation KL and buys
// in needles both depend on the budget (bench/results/README.md, "A reserve for the newest query").
#include <cstddef>
#include <span>

namespace dc {

struct SchedulePoint {
  double fraction = 0.0;  // budget / context tokens
  double share = 0.0;     // of the budget
  bool operator==(const SchedulePoint&) const = default;
};

namespace math {

// points: fractions strictly increasing (the caller checks); empty gives 0.
inline double schedule_share(std::span<const SchedulePoint> points, double fraction) {
  if (points.empty()) return 0.0;
  if (fraction <= points.front().fraction) return points.front().share;
  for (std::size_t i = 1; i < points.size(); ++i)
    if (fraction <= points[i].fraction) {
      const SchedulePoint a = points[i - 1], b = points[i];
      return a.share + (b.share - a.share) * (fraction - a.fraction) / (b.fraction - a.fraction);
    }
  return points.back().share;
}

// The largest a.share + b.share over every budget fraction, and the fraction where it is reached.
// Both are piecewise linear and constant beyond their ends, so the largest is at a point of one
// of them (or anywhere, when both are empty: 0 at fraction 1); of equal sums, the smallest fraction.
struct ScheduleSumMax {
  double share = 0.0;
  double fraction = 1.0;
};
inline ScheduleSumMax schedule_sum_max(std::span<const SchedulePoint> a, std::span<const SchedulePoint> b) {
  ScheduleSumMax best;
  bool any = false;
  for (const auto points : {a, b})
    for (const SchedulePoint& p : points) {
      const double sum = schedule_share(a, p.fraction) + schedule_share(b, p.fraction);
      if (!any || sum > best.share || (sum == best.share && p.fraction < best.fraction)) best = {sum, p.fraction};
      any = true;
    }
  return best;
}

}  // namespace math
}  // namespace dc
