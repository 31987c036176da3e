#pragma once
// Supervised warm start of the policy MLP before REINFORCE: fit its scores to a target score by
// mean squared error with Adam, over the rows of a few contexts' features.
//
// Why: a freshly initialised MLP scores every row about the same, so Gumbel-top-k samples
// nearly uniform keep-sets (KL ~ 1.7 nats on SmolLM2 at 256 tokens, against 0.5 for any
// heuristic), and the advantages between such rollouts say little about which tokens matter.
// Starting from a scaled copy of the attention mass (a heuristic ranking, ObservedAttention's)
// makes the first rollouts sensible and their noise local: the Gumbel noise then only reorders
// rows of similar scores, and REINFORCE learns what to change from there.
#include <cstdint>
#include <span>
#include <vector>

#include "../cpu/adam.hpp"
#include "../cpu/mlp.hpp"
#include "../policy/mlp_policy.hpp"

namespace dc {

struct WarmStartResult {
  double initial_mse = 0.0, final_mse = 0.0;
  std::int64_t rows = 0;
};

// inputs: [rows, policy inputs]; targets: [rows]. Full-batch Adam for `steps` steps.
inline WarmStartResult fit_policy_scores(MlpPolicy& policy, std::span<const float> inputs,
                                         std::span<const float> targets, int steps, float lr) {
  const MlpLayout& L = policy.layout();
  const std::int64_t n = std::int64_t(targets.size());
  DC_CHECK(n > 0 && std::int64_t(inputs.size()) == n * L.inputs, "warm start: ", inputs.size(),
           " inputs for ", n, " targets of ", L.inputs, " inputs each");
  DC_CHECK(steps >= 0, "warm start: negative step count ", steps);
  const Context<cpu> host;
  const auto rows = static_cast<std::size_t>(n);
  const std::size_t params = policy.params().size();
  std::vector<float> scores(rows), saved(rows * std::size_t(L.saved_per_row())), dscores(rows),
      grad(params), m(params, 0.0f), v(params, 0.0f);
  auto mse = [&]() {
    mlp_forward(host, L, policy.params().data(), inputs.data(), n, scores.data(), saved.data());
    double s = 0.0;
    for (std::size_t i = 0; i < rows; ++i) {
      const double d = double(scores[i]) - double(targets[i]);
      s += d * d;
      dscores[i] = float(2.0 * d / double(n));
    }
    return s / double(n);
  };
  WarmStartResult r;
  r.rows = n;
  r.initial_mse = mse();
  AdamHyper hyper;
  hyper.lr = lr;
  for (int t = 1; t <= steps; ++t) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    mlp_backward(host, L, policy.params().data(), inputs.data(), saved.data(), dscores.data(), n, grad.data());
    adam_update(host, policy.params().data(), grad.data(), m.data(), v.data(), std::int64_t(params), hyper, t);
    r.final_mse = mse();
  }
  if (steps == 0) r.final_mse = r.initial_mse;
  return r;
}

}  // namespace dc
