#pragma once
// The objective of the direct searches (compass_search.hpp, backward_elimination.hpp): a function
// that scores many points at once (one pass over the data for all of them), and its checked call.
#include <cmath>
#include <functional>
#include <vector>

#include "../core/error.hpp"

namespace dc {

using PointObjective = std::function<std::vector<double>(const std::vector<std::vector<float>>&)>;

// evaluate(points), refusing a wrong count of values or a non-finite one; `who` names the search.
inline std::vector<double> evaluate_points(const PointObjective& evaluate,
                                           const std::vector<std::vector<float>>& points, const char* who) {
  std::vector<double> f = evaluate(points);
  DC_CHECK(f.size() == points.size(), who, ": ", f.size(), " values for ", points.size(), " points");
  for (double v : f) DC_CHECK(std::isfinite(v), who, ": the objective is ", v);
  return f;
}

}  // namespace dc
