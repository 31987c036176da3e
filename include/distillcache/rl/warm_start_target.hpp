#pragma once
// The score a supervised warm start fits (rl/warm_start.hpp; examples/train --init-target): a
// combination of a row's policy inputs, written as comma-separated terms:
//   INPUT=C        adds C times that input
//   h2o            adds H2O's heavy-hitter score in the inputs (math::h2o_score_from_inputs:
//                  needs alpha and position) and, when budget_age is an input, H2O's recent half
//                  of the budget as a bonus that outranks every heavy-hitter score
//   max:INPUT=K    then raises the sum to at least that input plus K
// The max terms give a ranking that is one rule's except where another signal is stronger: e.g.
// "h2o,max:layer_last_alpha=2" ranks by accumulated attention but lifts every token the
// layer's newest query attends to more than about e^2 times the uniform share, a shape no sum
// of inputs has.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../math/policy_inputs.hpp"
#include "../policy/policy_inputs.hpp"

namespace dc {

class WarmStartTarget {
 public:
  WarmStartTarget(std::string_view spec, std::span<const PolicyInput> inputs)
      : coefficients_(inputs.size(), 0.0f) {
    auto index_of = [&](PolicyInput input, std::string_view why) {
      const auto at = std::find(inputs.begin(), inputs.end(), input);
      DC_CHECK(at != inputs.end(), "warm start target: ", std::string(why), " needs the input '",
               policy_input_name(input), "' among the policy's inputs");
      return std::size_t(at - inputs.begin());
    };
    std::size_t begin = 0;
    while (begin <= spec.size()) {
      const std::size_t comma = std::min(spec.find(',', begin), spec.size());
      std::string_view term = spec.substr(begin, comma - begin);
      begin = comma + 1;
      if (term.empty()) continue;
      if (term == "h2o") {
        h2o_ = true;
        continue;
      }
      const bool floor = term.substr(0, 4) == "max:";
      if (floor) term.remove_prefix(4);
      const std::size_t eq = term.find('=');
      DC_CHECK(eq != std::string_view::npos, "warm start target: '", std::string(term), "' is not ",
               floor ? "max:INPUT=OFFSET" : "INPUT=COEFFICIENT");
      const std::size_t input = index_of(parse_policy_input(term.substr(0, eq)), term.substr(0, eq));
      const std::string number(term.substr(eq + 1));
      char* end = nullptr;
      const double v = number.empty() ? NAN : std::strtod(number.c_str(), &end);
      DC_CHECK(end == number.c_str() + number.size() && std::isfinite(v), "warm start target: '",
               std::string(term), "' has no finite number after '='");
      if (floor)
        floors_.emplace_back(input, float(v));
      else
        coefficients_[input] = float(v);
    }
    if (h2o_) {
      alpha_at_ = index_of(PolicyInput::alpha, "h2o");
      position_at_ = index_of(PolicyInput::position, "h2o");
      const auto age = std::find(inputs.begin(), inputs.end(), PolicyInput::budget_age);
      h2o_recent_ = age != inputs.end();
      budget_age_at_ = std::size_t(age - inputs.begin());
    }
  }

  // The target of one row's inputs (in the policy's input order).
  float operator()(std::span<const float> row) const {
    DC_CHECK(row.size() == coefficients_.size(), "warm start target: a row of ", row.size(),
             " inputs for a target of ", coefficients_.size());
    float t = 0.0f;
    for (std::size_t j = 0; j < row.size(); ++j) t += coefficients_[j] * row[j];
    if (h2o_) t += math::h2o_score_from_inputs(row[alpha_at_], row[position_at_]);
    if (h2o_recent_ && math::h2o_recent_from_input(row[budget_age_at_])) t += math::kH2ORecentBonus;
    for (const auto& [input, offset] : floors_) t = std::max(t, row[input] + offset);
    return t;
  }

 private:
  std::vector<float> coefficients_;
  bool h2o_ = false, h2o_recent_ = false;
  std::size_t alpha_at_ = 0, position_at_ = 0, budget_age_at_ = 0;
  std::vector<std::pair<std::size_t, float>> floors_;  // max:INPUT=OFFSET terms
};

}  // namespace dc
