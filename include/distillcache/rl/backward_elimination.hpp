#pragma once
// Backward elimination of weights: each round scores the point with each of its nonzero
// coordinates set to zero in turn, and keeps the best such drop when it scores no worse than the
// point itself; it stops when every drop scores worse or nothing nonzero is left. Ties go to the
// point with fewer terms.
//
// Why here: compass search (compass_search.hpp) moves one weight at a time and never back to 0
// by itself, so a term its first rounds took in on 16 windows stays even if later moves make it
// useless. Scoring each drop on other, more windows than the search used is what lets a pass
// undo that. (Measured on policy v4, bench/results/README.md, "The pruning pass keeps v4": an
// ablation on Vim favoured dropping last_alpha, 64 training windows did not, and the pass kept it.)
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "point_objective.hpp"

namespace dc {

struct BackwardEliminationStep {
  int round = 0;                  // 1-based
  std::vector<float> x;           // the point the round started from
  double value = 0.0;             // f(x)
  std::vector<std::size_t> tried; // the coordinates whose drop was scored
  std::vector<double> dropped;    // f with each of them set to 0, in the order of `tried`
  std::ptrdiff_t kept = -1;       // the index into `tried` of the drop taken, -1 when none
};

struct BackwardEliminationResult {
  std::vector<float> x;
  double value = 0.0;              // f(x) (on the elimination's own objective)
  double start_value = 0.0;        // f(x0)
  std::vector<std::size_t> zeroed; // coordinates set to 0, in the order they were
  int rounds = 0, evaluations = 0;
};

// evaluate(points) returns f at each point in order. The first call gets x0 followed by its drops;
// later calls get only the drops (f is deterministic, so the kept drop's value is f(x)).
inline BackwardEliminationResult backward_elimination(
    std::vector<float> x0,
    const PointObjective& evaluate,
    const std::function<void(const BackwardEliminationStep&)>& on_round = {}) {
  const auto checked = [&](const std::vector<std::vector<float>>& points) {
    return evaluate_points(evaluate, points, "backward elimination");
  };
  BackwardEliminationResult r;
  r.x = std::move(x0);
  bool first = true;
  for (;;) {
    BackwardEliminationStep step;
    step.round = r.rounds + 1;
    step.x = r.x;
    std::vector<std::vector<float>> points;
    if (first) points.push_back(r.x);
    for (std::size_t i = 0; i < r.x.size(); ++i)
      if (r.x[i] != 0.0f) {
        step.tried.push_back(i);
        points.push_back(r.x);
        points.back()[i] = 0.0f;
      }
    if (step.tried.empty()) {  // nothing left to drop; x0 = 0 still gets its value
      if (first) {
        r.value = r.start_value = checked(points)[0];
        r.evaluations = 1;
      }
      break;
    }
    std::vector<double> f = checked(points);
    r.evaluations += int(points.size());
    if (first) {
      r.value = r.start_value = f.front();
      f.erase(f.begin());
      first = false;
    }
    step.value = r.value;
    step.dropped = f;
    ++r.rounds;
    std::size_t best = 0;
    for (std::size_t j = 1; j < f.size(); ++j)
      if (f[j] < f[best]) best = j;
    if (f[best] <= r.value) step.kept = std::ptrdiff_t(best);
    if (on_round) on_round(step);
    if (step.kept < 0) break;
    r.x[step.tried[best]] = 0.0f;
    r.value = f[best];
    r.zeroed.push_back(step.tried[best]);
  }
  return r;
}

}  // namespace dc
