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
#include "../math/softmax.hpp"
#include "../policy/mlp_policy.hpp"

namespace dc {

struct WarmStartResult {
  double initial_loss = 0.0, final_loss = 0.0;  // mean squared error, or cross-entropy (nats)
  std::int64_t rows = 0;
};

namespace detail {

// Full-batch Adam on the MLP's scores of n rows for `steps` steps: loss(scores, dscores) returns
// the loss of the scores and writes d loss / d score into dscores.
template <class Loss>
WarmStartResult fit_scores(MlpPolicy& policy, std::span<const float> inputs, std::int64_t n, int steps,
                           float lr, Loss&& loss) {
  const MlpLayout& L = policy.layout();
  DC_CHECK(n > 0 && std::int64_t(inputs.size()) == n * L.inputs, "warm start: ", inputs.size(),
           " inputs for ", n, " targets of ", L.inputs, " inputs each");
  DC_CHECK(steps >= 0, "warm start: negative step count ", steps);
  const Context<cpu> host;
  const auto rows = static_cast<std::size_t>(n);
  const std::size_t params = policy.params().size();
  std::vector<float> scores(rows), saved(rows * std::size_t(L.saved_per_row())), dscores(rows),
      grad(params), m(params, 0.0f), v(params, 0.0f);
  auto evaluate = [&]() {
    mlp_forward(host, L, policy.params().data(), inputs.data(), n, scores.data(), saved.data());
    return loss(std::span<const float>(scores), std::span<float>(dscores));
  };
  WarmStartResult r;
  r.rows = n;
  r.initial_loss = r.final_loss = evaluate();
  AdamHyper hyper;
  hyper.lr = lr;
  for (int t = 1; t <= steps; ++t) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    mlp_backward(host, L, policy.params().data(), inputs.data(), saved.data(), dscores.data(), n, grad.data());
    adam_update(host, policy.params().data(), grad.data(), m.data(), v.data(), std::int64_t(params), hyper, t);
    r.final_loss = evaluate();
  }
  return r;
}

}  // namespace detail

// Squared error: inputs [rows, policy inputs]; targets [rows].
inline WarmStartResult fit_policy_scores(MlpPolicy& policy, std::span<const float> inputs,
                                         std::span<const float> targets, int steps, float lr) {
  const std::int64_t n = std::int64_t(targets.size());
  return detail::fit_scores(policy, inputs, n, steps, lr, [&](std::span<const float> scores, std::span<float> dscores) {
    double s = 0.0;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      const double d = double(scores[i]) - double(targets[i]);
      s += d * d;
      dscores[i] = float(2.0 * d / double(n));
    }
    return s / double(n);
  });
}

// Listwise: the softmax of the scores over each group's rows is fitted to a target distribution
// over them by cross-entropy, -1/G sum_g sum_i p_i log softmax(s_g)_i, full-batch Adam.
//
// Why not squared error on a score: which rows a keep-set holds depends on the order of the
// scores at the top of each group, and the cost of evicting a row grows with its target mass
// (here the share of the continuation's attention it draws, eval/future_attention.hpp). Squared
// error on log-mass spends the fit on the many rows of near-zero mass, whose order changes
// nothing; the cross-entropy weighs each row by its target mass. It is also the Plackett-Luce
// model's own first pick (rl/plackett_luce.hpp): softmax(s) is the probability that a row is
// picked first, so REINFORCE starts from a sampler whose first pick follows the target.
// inputs: [rows, policy inputs]; group_offsets: G + 1 row offsets (0 first, rows last);
// targets: [rows], summing to 1 over each group (a group of zero mass is skipped).
inline WarmStartResult fit_policy_distributions(MlpPolicy& policy, std::span<const float> inputs,
                                                std::span<const std::int64_t> group_offsets,
                                                std::span<const float> targets, int steps, float lr) {
  const std::int64_t n = std::int64_t(targets.size());
  DC_CHECK(group_offsets.size() >= 2 && group_offsets.front() == 0 && group_offsets.back() == n,
           "warm start: group offsets must run from 0 to the ", n, " rows");
  std::vector<double> mass(group_offsets.size() - 1, 0.0);  // per group: the target's total
  std::size_t groups = 0;
  for (std::size_t g = 0; g < mass.size(); ++g) {
    DC_CHECK(group_offsets[g] <= group_offsets[g + 1], "warm start: group offsets must not decrease");
    for (std::int64_t i = group_offsets[g]; i < group_offsets[g + 1]; ++i) {
      DC_CHECK(targets[std::size_t(i)] >= 0.0f, "warm start: negative target ", targets[std::size_t(i)]);
      mass[g] += double(targets[std::size_t(i)]);
    }
    groups += mass[g] > 0.0 ? 1 : 0;
  }
  DC_CHECK(groups > 0, "warm start: every group's target mass is zero");
  return detail::fit_scores(policy, inputs, n, steps, lr, [&](std::span<const float> scores, std::span<float> dscores) {
    double loss = 0.0;
    for (std::size_t g = 0; g < mass.size(); ++g) {
      const auto b = std::size_t(group_offsets[g]), e = std::size_t(group_offsets[g + 1]);
      if (mass[g] <= 0.0) {  // nothing to fit: no gradient either
        std::fill(dscores.begin() + std::ptrdiff_t(b), dscores.begin() + std::ptrdiff_t(e), 0.0f);
        continue;
      }
      math::OnlineSoftmax z;
      for (std::size_t i = b; i < e; ++i) z.push(scores[i]);
      const float lse = z.log_sum_exp();
      for (std::size_t i = b; i < e; ++i) {
        const double p = double(targets[i]) / mass[g];
        loss -= p * double(scores[i] - lse);
        dscores[i] = float((double(expf(scores[i] - lse)) - p) / double(groups));  // d CE / d s
      }
    }
    return loss / double(groups);
  });
}

}  // namespace dc
