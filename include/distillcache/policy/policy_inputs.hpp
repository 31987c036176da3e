#pragma once
// The learned policy's input matrix: a chosen list of scale-free inputs per row
// (math/policy_inputs.hpp has the formulas and why they are scale-free).
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../cache/features.hpp"
#include "../math/policy_inputs.hpp"

namespace dc {

// The paper's five features, then optional ones: the newest query's mass (a second observation
// window: the newest query alone, TOVA's signal), the token's age in units of the budget
// (what a recency window of H2O's kind is measured in) and its age in tokens (what attention's
// locality is measured in), the depth of the group's layer (what the cost of evicting differs
// by), and the newest query's mass averaged over every KV head of the row's layer (TOVA's own
// signal: per-layer keep-sets by it keep needles that per-head ones lose, so a head-granular
// policy needs it as an input to do the same).
enum class PolicyInput : int {
  alpha = 0, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth, layer_last_alpha
};
inline constexpr int kNumPolicyInputs = 10;
inline constexpr const char* kPolicyNormalisation = "scale_free_v1";

inline const char* policy_input_name(PolicyInput i) {
  constexpr std::array<const char*, kNumPolicyInputs> names = {
      "alpha",      "value_norm", "head_variance", "entropy", "position",
      "last_alpha", "budget_age", "log_age",       "depth",   "layer_last_alpha"};
  return names[std::size_t(i)];
}

inline PolicyInput parse_policy_input(std::string_view name) {
  for (int i = 0; i < kNumPolicyInputs; ++i)
    if (name == policy_input_name(PolicyInput(i))) return PolicyInput(i);
  DC_FAIL("unknown policy input '", std::string(name),
          "' (known: alpha, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth, "
          "layer_last_alpha)");
}

inline std::vector<PolicyInput> paper_policy_inputs() {
  return {PolicyInput::alpha, PolicyInput::value_norm, PolicyInput::head_variance,
          PolicyInput::entropy, PolicyInput::position};
}

// Per row: the newest observed query's mass at the row's position, averaged over every KV head of
// the layers its group covers (a head that evicted the position counts 0). At shared and layer
// granularity a group already covers whole layers, so this is last_query_mass; at head
// granularity the heads of a layer hold different positions (per-head keep-sets), so rows are
// matched by position, not slot.
inline std::vector<float> layer_last_query_mass(const TokenFeatures& f) {
  for (int r = 0; r < f.size; ++r)  // rows are matched by position: it must index [0, latest]
    DC_CHECK(f.position[std::size_t(r)] >= 0 && f.position[std::size_t(r)] <= f.latest_position,
             "layer_last_alpha: row ", r, " has position ", f.position[std::size_t(r)], " outside [0, ",
             f.latest_position, "]");
  std::vector<float> out(std::size_t(f.size), 0.0f);
  // The groups of each layer range, and how many KV heads the range has in all.
  std::vector<std::vector<int>> ranges;
  std::vector<std::pair<int, int>> range_layers;
  for (int g = 0; g < f.num_groups(); ++g) {
    const FeatureGroup& grp = f.groups[std::size_t(g)];
    const std::pair<int, int> key{grp.layer_begin, grp.layer_end};
    const auto at = std::find(range_layers.begin(), range_layers.end(), key);
    if (at == range_layers.end()) {
      range_layers.push_back(key);
      ranges.push_back({g});
    } else {
      ranges[std::size_t(at - range_layers.begin())].push_back(g);
    }
  }
  const int num_ranges = int(ranges.size());
  DC_OMP(parallel for schedule(dynamic) if (num_ranges > 1 && f.size > 4096))
  for (int r = 0; r < num_ranges; ++r) {
    int heads = 0;
    for (int g : ranges[std::size_t(r)]) heads += f.groups[std::size_t(g)].head_end - f.groups[std::size_t(g)].head_begin;
    std::vector<float> sum(std::size_t(f.latest_position) + 1, 0.0f);  // by position
    for (int g : ranges[std::size_t(r)]) {
      const FeatureGroup& grp = f.groups[std::size_t(g)];
      const float weight = float(grp.head_end - grp.head_begin);  // last_query_mass is a mean over them
      for (int row = grp.row_begin; row < grp.row_end; ++row)
        sum[std::size_t(f.position[std::size_t(row)])] += weight * f.last_query_mass[std::size_t(row)];
    }
    for (int g : ranges[std::size_t(r)])
      for (int row = f.groups[std::size_t(g)].row_begin; row < f.groups[std::size_t(g)].row_end; ++row)
        out[std::size_t(row)] = sum[std::size_t(f.position[std::size_t(row)])] / float(heads > 0 ? heads : 1);
  }
  return out;
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
  const bool wants_layer_last =
      std::find(inputs.begin(), inputs.end(), PolicyInput::layer_last_alpha) != inputs.end();
  const std::vector<float> layer_last = wants_layer_last ? layer_last_query_mass(f) : std::vector<float>();
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
          case PolicyInput::layer_last_alpha:
            row[j] = math::input_log_relative_mass(layer_last[std::size_t(r)], n);
            break;
        }
      }
    }
  }
  return out;
}

}  // namespace dc
