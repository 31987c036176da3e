#pragma once
// The gradient of the REINFORCE loss through one sampled eviction:
//   loss = - weight * log p(picks | scores) - entropy_weight * sum_g H_g(scores)
// with log p the Plackett-Luce log-probability of every group's ordered picks (summed over the
// groups) and H_g the first-pick entropy of group g (rl/plackett_luce.hpp says why that one).
// The scores are the MLP's on the recorded inputs plus the policy's score base (which has no
// parameters: d score / d MLP output = 1); d loss / d scores goes back through the MLP
// (cpu/mlp.hpp) and is added to grad.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../cpu/mlp.hpp"
#include "plackett_luce.hpp"
#include "sampled_eviction.hpp"

namespace dc {

struct PolicyGradientTerms {
  double log_prob = 0.0;  // sum over groups
  double entropy = 0.0;   // sum over groups of the first-pick entropy
};

inline PolicyGradientTerms accumulate_policy_gradient(const MlpPolicy& policy,
                                                      const SampledEviction& e, double weight,
                                                      double entropy_weight, std::span<float> grad) {
  const MlpLayout& L = policy.layout();
  DC_CHECK(std::int64_t(grad.size()) == L.parameters(), "policy gradient: ", grad.size(),
           " gradient entries for ", L.parameters(), " parameters");
  const std::int64_t n = e.rows();
  DC_CHECK(std::int64_t(e.inputs.size()) == n * L.inputs, "policy gradient: the eviction recorded ",
           e.inputs.size(), " inputs for ", n, " rows of ", L.inputs);
  const auto rows = static_cast<std::size_t>(n);
  std::vector<float> scores(rows), saved(rows * std::size_t(L.saved_per_row()));
  DC_CHECK(policy.score_base() == ScoreBase::none || std::int64_t(e.accumulated_mass.size()) == n,
           "policy gradient: the eviction recorded ", e.accumulated_mass.size(), " masses for ", n,
           " rows, and the policy's score base reads them");
  mlp_forward(Context<cpu>{}, L, policy.params().data(), e.inputs.data(), n, scores.data(), saved.data());
  add_score_base(policy.score_base(), e.accumulated_mass.data(), int(n), scores.data());  // no parameters
  DC_CHECK(std::isfinite(e.temperature) && e.temperature > 0.0f, "policy gradient: temperature ",
           e.temperature, " must be finite and > 0");
  // The sample is of scores / temperature: log p and the entropy are taken there, and
  // d(score / temperature) / d score = 1 / temperature.
  const double inv_t = 1.0 / double(e.temperature);
  std::vector<double> s(rows), dlogp(rows, 0.0), dh(rows, 0.0);
  for (std::size_t i = 0; i < rows; ++i) s[i] = double(scores[i] / e.temperature);
  PolicyGradientTerms t;
  t.log_prob = plackett_luce_log_prob_groups(std::span<const double>(s), e.group_offsets, e.picks, dlogp);
  if (entropy_weight != 0.0)
    t.entropy = first_pick_entropy_groups(std::span<const double>(s), e.group_offsets, dh);
  std::vector<float> dscores(rows);
  for (std::size_t i = 0; i < dscores.size(); ++i)
    dscores[i] = float((-weight * dlogp[i] - entropy_weight * dh[i]) * inv_t);
  mlp_backward(Context<cpu>{}, L, policy.params().data(), e.inputs.data(), saved.data(),
               dscores.data(), n, grad.data());
  return t;
}

}  // namespace dc
