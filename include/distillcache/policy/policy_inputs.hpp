#pragma once
// The learned policy's input matrix: a chosen list of scale-free inputs per row
// (math/policy_inputs.hpp has the formulas and why they are scale-free).
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../cache/features.hpp"
#include "../math/policy_inputs.hpp"

namespace dc {

// The paper's five features, then optional ones: the newest query's mass (a second observation
// window: the newest query alone, TOVA's signal), the token's age in units of the budget
// (what a recency window of H2O's kind is measured in) and its age in tokens (what attention's
// locality is measured in), and the depth of the group's layer (what the cost of evicting differs
// by).
enum class PolicyInput : int { alpha = 0, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth };
inline constexpr int kNumPolicyInputs = 9;
inline constexpr const char* kPolicyNormalisation = "scale_free_v1";

inline const char* policy_input_name(PolicyInput i) {
  constexpr std::array<const char*, kNumPolicyInputs> names = {
      "alpha", "value_norm", "head_variance", "entropy", "position", "last_alpha", "budget_age", "log_age", "depth"};
  return names[std::size_t(i)];
}

inline PolicyInput parse_policy_input(std::string_view name) {
  for (int i = 0; i < kNumPolicyInputs; ++i)
    if (name == policy_input_name(PolicyInput(i))) return PolicyInput(i);
  DC_FAIL("unknown policy input '", std::string(name),
          "' (known: alpha, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth)");
}

inline std::vector<PolicyInput> paper_policy_inputs() {
  return {PolicyInput::alpha, PolicyInput::value_norm, PolicyInput::head_variance,
          PolicyInput::entropy, PolicyInput::position};
}

// [f.size, inputs.size()] row-major: the inputs of every row, in the order asked for; budget is
// the number of rows each group keeps (only budget_age reads it).
inline std::vector<float> policy_inputs(const TokenFeatures& f, std::span<const PolicyInput> inputs,
                                        int budget) {
  DC_CHECK(!inputs.empty(), "policy_inputs: no inputs asked for");
  DC_CHECK(budget >= 1 || std::find(inputs.begin(), inputs.end(), PolicyInput::budget_age) == inputs.end(),
           "policy_inputs: budget_age needs a budget of at least 1 row, got ", budget);
  const std::size_t k = inputs.size();
  std::vector<float> out(std::size_t(f.size) * k);
  // Groups are independent (each its own rows and means): in parallel, since the logarithms of
  // 737k rows (SmolLM2 at 8k, head granularity) took longer than the MLP that reads them.
  const int groups = f.num_groups();
  int layers = 0;  // the layers the groups span (depth's scale)
  for (const FeatureGroup& g : f.groups) layers = std::max(layers, g.layer_end);
  DC_OMP(parallel for schedule(dynamic) if (groups > 1 && f.size > 4096))
  for (int group = 0; group < groups; ++group) {
    const FeatureGroup& g = f.groups[std::size_t(group)];
    const int n = g.rows();
    double norm_sum = 0.0;
    for (int r = g.row_begin; r < g.row_end; ++r) norm_sum += f.feature(r, Feature::value_norm);
    const float mean_norm = n > 0 ? float(norm_sum / n) : 0.0f;
    for (int r = g.row_begin; r < g.row_end; ++r) {
      float* row = out.data() + std::size_t(r) * k;
      for (std::size_t j = 0; j < k; ++j) {
        switch (inputs[j]) {
          case PolicyInput::alpha:
            row[j] = math::input_log_relative_mass(f.feature(r, Feature::alpha), n);
            break;
          case PolicyInput::value_norm:
            row[j] = math::input_log_relative_norm(f.feature(r, Feature::value_norm), mean_norm);
            break;
          case PolicyInput::head_variance:
            row[j] = math::input_log_relative_spread(f.feature(r, Feature::head_variance), n);
            break;
          case PolicyInput::entropy:
            row[j] = math::input_relative_entropy(f.feature(r, Feature::entropy), n);
            break;
          case PolicyInput::position: row[j] = f.feature(r, Feature::position); break;
          case PolicyInput::last_alpha:
            row[j] = math::input_log_relative_mass(f.last_query_mass[std::size_t(r)], n);
            break;
          case PolicyInput::budget_age:
            row[j] = math::input_log_budget_age(f.latest_position - f.position[std::size_t(r)], budget);
            break;
          case PolicyInput::log_age:
            row[j] = math::input_log_age(f.latest_position - f.position[std::size_t(r)]);
            break;
          case PolicyInput::depth: row[j] = math::input_depth(g.layer_begin, g.layer_end, layers); break;
        }
      }
    }
  }
  return out;
}

}  // namespace dc
