#pragma once
// Compass search (Kolda, Lewis & Torczon 2003, "Optimization by direct search"): a
// derivative-free minimiser for a few parameters whose objective is exact but whose gradient is
// not available. Each round polls x +- step e_i along every coordinate, moves to the best poll
// point if it improves f(x) by more than min_improvement (relative) and then multiplies the step
// by `expand` (up to max_step), and halves the step when none does; it stops when the step falls
// below min_step or after max_rounds. Expanding after a success lets a weight whose optimum is
// far travel there in a few rounds instead of one initial step per round.
//
// Why here: the KL of a greedy keep-set is a deterministic function of the policy's weights, so
// for a handful of weights (policy/linear_correction.hpp) polling it directly gives exact
// comparisons, where REINFORCE's score-function gradient of the same reward measured ~92 %
// noise per update (bench/results/README.md). evaluate() takes every poll point of a round at
// once, so that one pass over the data (one prefill per context) scores them all.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "../core/error.hpp"
#include "point_objective.hpp"

namespace dc {

struct CompassSearchOptions {
  double step = 0.5;              // initial step along each coordinate
  double min_step = 0.0625;       // stop once the step is below this
  double max_step = 0.0;          // the step never grows past this (0: the initial step)
  double expand = 2.0;            // step factor after a successful round (>= 1)
  int max_rounds = 16;            // rounds of 2n poll points each
  double min_improvement = 0.0;   // a move needs f < f(x) - min_improvement |f(x)|

  void validate() const {
    DC_CHECK(std::isfinite(step) && step > 0.0, "compass search: step ", step, " must be > 0");
    DC_CHECK(std::isfinite(min_step) && min_step > 0.0 && min_step <= step, "compass search: "
             "minimum step ", min_step, " must be in (0, step = ", step, "]");
    DC_CHECK(std::isfinite(max_step) && (max_step == 0.0 || max_step >= step), "compass search: maximum "
             "step ", max_step, " must be 0 (the initial step) or >= the step ", step);
    DC_CHECK(std::isfinite(expand) && expand >= 1.0, "compass search: expansion ", expand, " must be >= 1");
    DC_CHECK(max_rounds >= 1, "compass search: ", max_rounds, " rounds");
    DC_CHECK(std::isfinite(min_improvement) && min_improvement >= 0.0 && min_improvement < 1.0,
             "compass search: minimum relative improvement ", min_improvement, " must be in [0, 1)");
  }
};

struct CompassSearchRound {
  int round = 0;             // 1-based; 0 reports the starting point
  double step = 0.0;         // the step this round polled with
  double value = 0.0;        // f(x) after the round
  bool moved = false;
  std::vector<float> x;      // x after the round
};

struct CompassSearchResult {
  std::vector<float> x;
  double value = 0.0;
  int rounds = 0, evaluations = 0;
};

// Minimises f from x0. evaluate(points) returns f at each point (in order); the first call gets
// x0 alone. on_round(r) is called with round 0 (x0 and f(x0)), then after every round.
inline CompassSearchResult compass_search(
    std::vector<float> x0, const CompassSearchOptions& opt,
    const PointObjective& evaluate,
    const std::function<void(const CompassSearchRound&)>& on_round = {}) {
  opt.validate();
  DC_CHECK(!x0.empty(), "compass search: no parameters");
  const auto checked = [&](const std::vector<std::vector<float>>& points) {
    return evaluate_points(evaluate, points, "compass search");
  };
  CompassSearchResult r{x0, checked({x0})[0], 0, 1};
  double step = opt.step;
  const double max_step = opt.max_step > 0.0 ? opt.max_step : opt.step;
  if (on_round) on_round({0, step, r.value, false, r.x});  // round 0: where it starts
  while (r.rounds < opt.max_rounds && step >= opt.min_step) {
    std::vector<std::vector<float>> poll;
    for (std::size_t i = 0; i < r.x.size(); ++i)
      for (double sign : {1.0, -1.0}) {
        poll.push_back(r.x);
        poll.back()[i] = float(double(r.x[i]) + sign * step);
      }
    const std::vector<double> f = checked(poll);
    r.evaluations += int(poll.size());
    std::size_t best = 0;
    for (std::size_t j = 1; j < f.size(); ++j)
      if (f[j] < f[best]) best = j;
    CompassSearchRound round{++r.rounds, step, r.value, false, {}};
    if (f[best] < r.value - opt.min_improvement * std::abs(r.value)) {
      r.x = poll[best];
      r.value = f[best];
      round.moved = true;
      step = std::min(step * opt.expand, max_step);
    } else {
      step *= 0.5;
    }
    round.value = r.value;
    round.x = r.x;
    if (on_round) on_round(round);
  }
  return r;
}

}  // namespace dc
