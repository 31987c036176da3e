#pragma once
// Plackett-Luce log-probability of an ordered sample and its gradient, and the first-pick
// entropy bonus: the pieces of the REINFORCE loss over Gumbel-top-k keep-sets (cpu/topk.hpp,
// cuda/topk.cuh draw the samples).
//
// One group, scores s[n], ordered sample pi[B] (distinct indices into s, first pick first),
// U = the never-picked items:
//   log p(pi) = sum_{j<B} [ s_{pi_j} - LSE_j ],   LSE_j = logsumexp(s over {pi_j..pi_{B-1}} + U)
//             = logaddexp(LSE(U), suffix-LSE of s_pi from j)   (never a difference of exps)
//   d log p / d s_i = 1[i = pi_m] - sum_{j <= m} exp(s_i - LSE_j)   for i = pi_m,
//                   =             - sum_{j <  B} exp(s_i - LSE_j)   for i in U,
// with the prefix sums of exp(-LSE_j) kept as logs (A_m = log sum_{j<=m} exp(-LSE_j)), so every
// exponent s_i + A_m is <= log(B): scores spread over hundreds of nats neither overflow nor
// lose the small terms. O(n + B) per group; everything accumulates in double.
//
// Scores must be finite (a -inf score has probability 0 and no gradient). Gradients are
// written, not accumulated; an empty gradient span skips them.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../math/plackett_luce.hpp"

namespace dc {
namespace rl_detail {

// base: the global row of s[0], for messages (0 for a lone group).
template <class T>
void check_finite_scores(std::span<const T> s, std::size_t base, const char* who) {
  for (std::size_t i = 0; i < s.size(); ++i)
    DC_CHECK(std::isfinite(double(s[i])), who, ": score of row ", base + i, " is not finite (",
             double(s[i]), ")");
}

// log p and (if grad is not empty) its gradient for one group. order holds indices into s;
// picked is scratch of at least s.size() zeros, left zeroed again.
template <class T>
double pl_group(std::span<const T> s, std::span<const std::int32_t> order, std::span<T> grad,
                std::size_t base, const char* who, std::vector<char>& picked) {
  const std::size_t n = s.size(), b = order.size();
  DC_CHECK(b <= n, who, ": a sample of ", b, " picks from a group of ", n, " rows");
  for (std::size_t j = 0; j < b; ++j) {
    const std::int32_t i = order[j];
    DC_CHECK(i >= 0 && std::size_t(i) < n, who, ": pick ", j, " is row ", base + std::size_t(i),
             ", outside its group [", base, ", ", base + n, ")");
    DC_CHECK(!picked[std::size_t(i)], who, ": row ", base + std::size_t(i),
             " is picked twice in one sample");
    picked[std::size_t(i)] = 1;
  }

  // LSE(U) in two passes: max, then the shifted sum (every term <= 1).
  double max_u = -INFINITY;
  for (std::size_t i = 0; i < n; ++i)
    if (!picked[i] && double(s[i]) > max_u) max_u = double(s[i]);
  double lse_u = -INFINITY;
  if (max_u > -INFINITY) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      if (!picked[i]) sum += std::exp(double(s[i]) - max_u);
    lse_u = max_u + std::log(sum);
  }

  // LSE_j from the suffix of the sample, back to front.
  std::vector<double> lse(b);
  double suffix = -INFINITY;
  for (std::size_t j = b; j-- > 0;) {
    suffix = math::log_add_exp(suffix, double(s[std::size_t(order[j])]));
    lse[j] = math::log_add_exp(lse_u, suffix);
  }
  double log_p = 0.0;
  for (std::size_t j = 0; j < b; ++j) log_p += double(s[std::size_t(order[j])]) - lse[j];

  if (!grad.empty()) {
    double prefix = -INFINITY;  // A_m = log sum_{j<=m} exp(-LSE_j)
    for (std::size_t m = 0; m < b; ++m) {
      prefix = math::log_add_exp(prefix, -lse[m]);
      const auto i = std::size_t(order[m]);
      grad[i] = T(1.0 - std::exp(double(s[i]) + prefix));
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!picked[i]) grad[i] = T(-std::exp(double(s[i]) + prefix));
  }
  for (std::size_t j = 0; j < b; ++j) picked[std::size_t(order[j])] = 0;
  return log_p;
}

template <class T>
double pl_log_prob(std::span<const T> s, std::span<const std::int32_t> order, std::span<T> grad) {
  constexpr const char* who = "plackett_luce_log_prob";
  DC_CHECK(grad.empty() || grad.size() == s.size(), who, ": gradient of ", grad.size(),
           " entries for ", s.size(), " scores");
  check_finite_scores(s, 0, who);
  std::vector<char> picked(s.size(), 0);
  return pl_group(s, order, grad, 0, who, picked);
}

template <class T>
double pl_log_prob_groups(std::span<const T> s, std::span<const std::int32_t> group_offsets,
                          const GroupSamples& samples, std::span<T> grad) {
  constexpr const char* who = "plackett_luce_log_prob_groups";
  check_group_offsets(group_offsets, s.size(), who);
  DC_CHECK(grad.empty() || grad.size() == s.size(), who, ": gradient of ", grad.size(),
           " entries for ", s.size(), " scores");
  DC_CHECK(samples.offsets.size() == group_offsets.size(), who, ": samples of ",
           samples.groups(), " groups for ", group_offsets.size() - 1, " groups");
  check_group_offsets(samples.offsets, samples.rows.size(), "plackett_luce_log_prob_groups (samples)");
  check_finite_scores(s, 0, who);

  std::vector<char> picked;
  std::vector<std::int32_t> local;
  double total = 0.0;
  for (int g = 0; g < samples.groups(); ++g) {
    const auto begin = std::size_t(group_offsets[std::size_t(g)]);
    const auto n = std::size_t(group_offsets[std::size_t(g) + 1]) - begin;
    const std::span<const std::int32_t> rows = samples.group(g);
    // Global row ids -> indices within the group (pl_group range-checks them).
    local.resize(rows.size());
    for (std::size_t j = 0; j < rows.size(); ++j) {
      DC_CHECK(rows[j] >= std::int32_t(begin) && std::size_t(rows[j]) < begin + n, who,
               ": pick ", j, " of group ", g, " is row ", rows[j], ", outside the group [", begin,
               ", ", begin + n, ")");
      local[j] = rows[j] - std::int32_t(begin);
    }
    if (picked.size() < n) picked.resize(n, 0);
    total += pl_group(s.subspan(begin, n), std::span<const std::int32_t>(local),
                      grad.empty() ? grad : grad.subspan(begin, n), begin, who, picked);
  }
  return total;
}

// Entropy of softmax(s) and (if grad is not empty) dH/ds_i = -p_i (log p_i + H).
template <class T>
double entropy_group(std::span<const T> s, std::span<T> grad) {
  if (s.empty()) return 0.0;
  double max = -INFINITY;
  for (const T x : s) max = double(x) > max ? double(x) : max;
  double sum = 0.0;
  for (const T x : s) sum += std::exp(double(x) - max);
  const double lse = max + std::log(sum);
  double h = 0.0;
  for (const T x : s) {
    const double log_p = double(x) - lse;
    h -= std::exp(log_p) * log_p;  // p underflows to 0 with log_p finite: term 0, never NaN
  }
  if (!grad.empty())
    for (std::size_t i = 0; i < s.size(); ++i) {
      const double log_p = double(s[i]) - lse;
      grad[i] = T(-std::exp(log_p) * (log_p + h));
    }
  return h;
}

template <class T>
double entropy_one(std::span<const T> s, std::span<T> grad) {
  constexpr const char* who = "first_pick_entropy";
  DC_CHECK(grad.empty() || grad.size() == s.size(), who, ": gradient of ", grad.size(),
           " entries for ", s.size(), " scores");
  check_finite_scores(s, 0, who);
  return entropy_group(s, grad);
}

template <class T>
double entropy_groups(std::span<const T> s, std::span<const std::int32_t> group_offsets,
                      std::span<T> grad) {
  constexpr const char* who = "first_pick_entropy_groups";
  check_group_offsets(group_offsets, s.size(), who);
  DC_CHECK(grad.empty() || grad.size() == s.size(), who, ": gradient of ", grad.size(),
           " entries for ", s.size(), " scores");
  check_finite_scores(s, 0, who);
  double total = 0.0;
  for (std::size_t g = 0; g + 1 < group_offsets.size(); ++g) {
    const auto begin = std::size_t(group_offsets[g]);
    const auto n = std::size_t(group_offsets[g + 1]) - begin;
    total += entropy_group(s.subspan(begin, n), grad.empty() ? grad : grad.subspan(begin, n));
  }
  return total;
}

}  // namespace rl_detail

// log p of the ordered sample `order` (indices into scores, first pick first) under
// Plackett-Luce with weights exp(scores); grad [n] (optional) receives d log p / d scores.
inline double plackett_luce_log_prob(std::span<const float> scores,
                                     std::span<const std::int32_t> order,
                                     std::span<float> grad = {}) {
  return rl_detail::pl_log_prob(scores, order, grad);
}
inline double plackett_luce_log_prob(std::span<const double> scores,
                                     std::span<const std::int32_t> order,
                                     std::span<double> grad = {}) {
  return rl_detail::pl_log_prob(scores, order, grad);
}

// Sum over groups of the log p of each group's sample. scores [rows]; group_offsets
// [groups + 1]; samples: per group an ordered sample of GLOBAL row ids inside that group, as
// topk_groups returns (any 0..n_g picks per group); grad [rows] (optional) receives the
// gradient for every row.
inline double plackett_luce_log_prob_groups(std::span<const float> scores,
                                            std::span<const std::int32_t> group_offsets,
                                            const GroupSamples& samples,
                                            std::span<float> grad = {}) {
  return rl_detail::pl_log_prob_groups(scores, group_offsets, samples, grad);
}
inline double plackett_luce_log_prob_groups(std::span<const double> scores,
                                            std::span<const std::int32_t> group_offsets,
                                            const GroupSamples& samples,
                                            std::span<double> grad = {}) {
  return rl_detail::pl_log_prob_groups(scores, group_offsets, samples, grad);
}

// The entropy bonus: H = -sum_i p_i log p_i of the FIRST pick, p = softmax(scores), with
// dH/ds_i = -p_i (log p_i + H) into grad (optional). The entropy of the whole B-subset
// Plackett-Luce distribution is a sum over n!/(n-B)! ordered samples with no closed form, so it
// is intractable at cache sizes; the first pick's entropy is exact, cheap, and still rewards
// keeping the distribution spread (it is 0 only when one row dominates).
inline double first_pick_entropy(std::span<const float> scores, std::span<float> grad = {}) {
  return rl_detail::entropy_one(scores, grad);
}
inline double first_pick_entropy(std::span<const double> scores, std::span<double> grad = {}) {
  return rl_detail::entropy_one(scores, grad);
}

// Sum over groups of the first-pick entropy of each group; grad [rows] (optional).
inline double first_pick_entropy_groups(std::span<const float> scores,
                                        std::span<const std::int32_t> group_offsets,
                                        std::span<float> grad = {}) {
  return rl_detail::entropy_groups(scores, group_offsets, grad);
}
inline double first_pick_entropy_groups(std::span<const double> scores,
                                        std::span<const std::int32_t> group_offsets,
                                        std::span<double> grad = {}) {
  return rl_detail::entropy_groups(scores, group_offsets, grad);
}

}  // namespace dc
