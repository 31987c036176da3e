#pragma once
// Fidelity of an evicted cache to the full cache, step by step: KL(full || evicted) in nats,
// agreement of the argmax tokens, and the negative log-likelihood of the true next token under
// both, from which the perplexity ratio follows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "../core/error.hpp"
#include "../core/finite.hpp"
#include "../math/kl.hpp"
#include "../math/softmax.hpp"
#include "../model/sampling.hpp"

namespace dc {

inline float log_sum_exp(std::span<const float> logits) {
  check_logits(logits, "log_sum_exp");
  math::OnlineSoftmax s;
  for (float x : logits) s.push(x);
  return s.log_sum_exp();
}

// KL(P || Q) for P = softmax(full), Q = softmax(evicted), accumulated in double. A token that
// P allows and Q bans (-inf) makes it +inf, as it should.
// The sum itself, for rows whose log-sum-exps are already known.
inline double kl_divergence(std::span<const float> full, float lse_p, std::span<const float> evicted,
                            float lse_q) {
  double kl = 0.0;
  for (std::size_t v = 0; v < full.size(); ++v)
    kl += math::kl_term(full[v] - lse_p, evicted[v] - lse_q);
  return kl > 0.0 ? kl : 0.0;  // rounding can give -1e-9 for identical rows
}

inline double kl_divergence(std::span<const float> full, std::span<const float> evicted) {
  DC_CHECK(full.size() == evicted.size() && !full.empty(), "kl_divergence: ", full.size(),
           " vs ", evicted.size(), " logits");
  return kl_divergence(full, log_sum_exp(full), evicted, log_sum_exp(evicted));
}

struct FidelityTotals {
  double kl_sum = 0.0;
  double nll_full_sum = 0.0, nll_evicted_sum = 0.0;
  std::int64_t agreements = 0, steps = 0;

  // Adds one step: the two logit rows and the true next token.
  void add(std::span<const float> full, std::span<const float> evicted, std::int32_t target) {
    DC_CHECK(full.size() == evicted.size() && !full.empty(), "fidelity step: ", full.size(),
             " vs ", evicted.size(), " logits");
    DC_CHECK(target >= 0 && std::size_t(target) < full.size(), "target token ", target,
             " outside the vocabulary");
    const float lse_full = log_sum_exp(full), lse_evicted = log_sum_exp(evicted);  // check both
    kl_sum += kl_divergence(full, lse_full, evicted, lse_evicted);
    agreements += argmax(full) == argmax(evicted);
    nll_full_sum += double(lse_full) - full[std::size_t(target)];
    nll_evicted_sum += double(lse_evicted) - evicted[std::size_t(target)];
    ++steps;
  }
  void merge(const FidelityTotals& o) {
    kl_sum += o.kl_sum;
    nll_full_sum += o.nll_full_sum;
    nll_evicted_sum += o.nll_evicted_sum;
    agreements += o.agreements;
    steps += o.steps;
  }

  double kl_mean() const { return steps ? kl_sum / double(steps) : 0.0; }
  double top1_agreement() const { return steps ? double(agreements) / double(steps) : 0.0; }
  // exp(mean NLL evicted) / exp(mean NLL full).
  double ppl_ratio() const {
    return steps ? std::exp((nll_evicted_sum - nll_full_sum) / double(steps)) : 1.0;
  }
};

// What `total` gained since `earlier` (an earlier copy of it): one context's totals.
inline FidelityTotals difference(const FidelityTotals& total, const FidelityTotals& earlier) {
  FidelityTotals d;
  d.kl_sum = total.kl_sum - earlier.kl_sum;
  d.nll_full_sum = total.nll_full_sum - earlier.nll_full_sum;
  d.nll_evicted_sum = total.nll_evicted_sum - earlier.nll_evicted_sum;
  d.agreements = total.agreements - earlier.agreements;
  d.steps = total.steps - earlier.steps;
  return d;
}

// The 95 % Wilson score interval of a proportion: `successes` of `trials` (successes may be
// fractional, e.g. a sum of per-sample partial scores). Unlike p +- z sqrt(p(1-p)/n) it stays
// inside [0, 1] and is not empty at 0 or n successes, which matters for the handful of samples
// a task evaluation runs.
struct Interval {
  double lo = 0.0, hi = 1.0;
};
inline Interval wilson_interval(double successes, double trials, double z = 1.959963984540054) {
  DC_CHECK(trials > 0.0 && successes >= 0.0 && successes <= trials, "wilson_interval: ", successes,
           " successes of ", trials, " trials");
  const double p = successes / trials, z2n = z * z / trials;
  const double centre = (p + z2n / 2.0) / (1.0 + z2n);
  const double half = z / (1.0 + z2n) * std::sqrt(p * (1.0 - p) / trials + z2n / (4.0 * trials));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

}  // namespace dc
