#pragma once
// REINFORCE with a leave-one-out baseline (Kool et al. 2019, "Buy 4 REINFORCE samples, get a
// baseline for free"): K keep-sets are sampled for one (context, budget); rollout k's advantage
// is its return minus the mean return of the other K - 1, an unbiased baseline that needs no
// value network.
#include <cmath>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/finite.hpp"

namespace dc {

// A_k = G_k - mean_{j != k} G_j. With standardise, the advantages of the group are divided by
// the returns' standard deviation (when it is above 1e-8), so that every (context, budget)
// weighs the same in an update whatever its scale of KL: small budgets have KLs ten times those
// of large ones, and would otherwise decide every step alone.
inline std::vector<double> leave_one_out_advantages(std::span<const double> returns,
                                                    bool standardise = false) {
  const std::size_t k = returns.size();
  DC_CHECK(k >= 2, "leave-one-out advantages need at least 2 rollouts, got ", k);
  double sum = 0.0;
  for (double g : returns) {
    DC_CHECK(std::isfinite(g), "leave-one-out advantages: a return is ", g);
    sum += g;
  }
  std::vector<double> a(k);
  for (std::size_t i = 0; i < k; ++i) a[i] = returns[i] - (sum - returns[i]) / double(k - 1);
  if (standardise) {
    const double mean = sum / double(k);
    double var = 0.0;
    for (double g : returns) var += (g - mean) * (g - mean);
    const double sd = std::sqrt(var / double(k));
    if (sd > 1e-8)
      for (double& x : a) x /= sd;
  }
  return a;
}

}  // namespace dc
