#pragma once
// The learned policy's inputs: the per-row features of cache/features.hpp made scale-free, so one
// policy transfers across context lengths and models ("scale_free_v1").
//
// Raw features change scale with the context: with n tokens a uniform attention gives every
// token mass 1/n, so alpha halves when the context doubles, and value norms differ per model and
// layer. Each input is therefore taken relative to what is typical *within the row's group* (the
// rows one keep-set is chosen from):
//   alpha          log(alpha * n + eps)        mass relative to uniform (0 = uniform share)
//   value_norm     log(||v|| / mean ||v||)     relative to the group's mean value norm
//   head_variance  log(std * n + eps)          spread across heads, in the same units as alpha
//   entropy        H / log(n)                  fraction of the largest entropy n tokens allow
//   position       position / latest position  already in [0, 1]
//   last_alpha     log(last * n + eps)         the newest query's mass (TOVA's signal), relative
//   budget_age     log((age + 1) / B)          the token's age (latest - position) in budgets B
//   log_age        log(age + 1)                the token's age in tokens
//   depth          layer / (layers - 1)        the group's layer, 0 (first) to 1 (last)
//   layer_last_alpha log(last_layer * n + eps) the newest query's mass, mean over every KV head
//                                              of the row's layer (0 where a head evicted the
//                                              token): TOVA's per-layer signal on each head's rows
// n is the number of rows in the group. budget_age is scale-free in the budget rather than the
// group: H2O's recent window (the newest B/2 tokens) is budget_age < log(1/2) at every context
// length and budget, which position (relative to the context) cannot express. log_age is the one
// input measured in tokens, on purpose: how much a query attends to a recent token decays with
// their distance in tokens (a local pattern of the model, not of the context length), so the
// newest 32 tokens read the same at L and 2L, where position squeezes them towards 1. The
// depth is relative too (the same fraction of the way through any model): layers differ in what
// evicting them costs (on SmolLM2 the first three halve their budget for nearly nothing, a few
// middle and late ones carry most of the KL), which no per-token input tells the MLP.
// The logarithms are math::log_poly (within 2 ulps of logf, and it vectorises: the scoring of
// 737k rows spent a seventh of its time in logf). The logarithms keep heavy hitters (attention sinks take half the mass) and near-zero tokens in a range an MLP with small weights handles, and eps
// bounds the log for tokens no query attended to.
#include <cmath>

#include "../core/config.hpp"
#include "log_poly.hpp"

namespace dc::math {

inline constexpr float kPolicyInputEps = 1e-3f;

// log(mass * n + eps): 0 for the uniform share 1/n.
DC_HD_INLINE float input_log_relative_mass(float mass, int group_rows) {
  const float m = mass > 0.0f ? mass : 0.0f;
  return log_poly(m * static_cast<float>(group_rows) + kPolicyInputEps);
}

// log(v / mean): 0 for a typical value norm.
// A select, not an early return, so that a loop over a group's rows vectorises (GCC left the
// loop scalar with the branch when the norms came from a heap column).
DC_HD_INLINE float input_log_relative_norm(float norm, float group_mean_norm) {
  const float relative = log_poly((norm > 0.0f ? norm : 0.0f) / group_mean_norm + kPolicyInputEps);
  return group_mean_norm > 0.0f ? relative : 0.0f;  // every norm zero: nothing to tell rows apart
}

// log(std * n + eps) from the variance across heads; the second form takes the standard deviation
// sqrt(max(variance, 0)) already computed (the CPU loops take it in vector instructions).
DC_HD_INLINE float input_log_relative_std(float std_dev, int group_rows) {
  return input_log_relative_mass(std_dev, group_rows);
}
DC_HD_INLINE float input_log_relative_spread(float variance, int group_rows) {
  return input_log_relative_std(sqrtf(variance > 0.0f ? variance : 0.0f), group_rows);
}

// H / log(n): the entropy as a fraction of its largest value for n tokens. The second form takes
// log(n) computed once per group (input_entropy_scale), for loops over a group's rows.
DC_HD float input_entropy_scale(int group_rows) {
  return group_rows > 1 ? log_poly(static_cast<float>(group_rows)) : 0.0f;
}
DC_HD_INLINE float input_relative_entropy_scaled(float entropy, float entropy_scale) {
  return entropy_scale > 0.0f ? entropy / entropy_scale : 0.0f;
}
DC_HD float input_relative_entropy(float entropy, int group_rows) {
  return input_relative_entropy_scaled(entropy, input_entropy_scale(group_rows));
}

// log((age + 1) / budget), age = latest position - position >= 0: the newest token reads
// log(1 / B), the token B - 1 steps older reads 0.
DC_HD_INLINE float input_log_budget_age(int age, int budget) {
  const float a = static_cast<float>(age > 0 ? age : 0) + 1.0f;
  return log_poly(a / static_cast<float>(budget > 1 ? budget : 1));
}

// log(age + 1), age = latest position - position >= 0: 0 for the newest token.
DC_HD_INLINE float input_log_age(int age) { return log_poly(static_cast<float>(age > 0 ? age : 0) + 1.0f); }

// The mean layer a group covers [layer_begin, layer_end), as a fraction of the way from the
// first layer to the last of `layers`: 0.5 for a group covering every layer (a shared set).
DC_HD float input_depth(int layer_begin, int layer_end, int layers) {
  const float mid = 0.5f * static_cast<float>(layer_begin + layer_end - 1);
  return layers > 1 ? mid / static_cast<float>(layers - 1) : 0.5f;
}

// The warm start's recent window in budget_age (H2O keeps the newest half of its budget), and
// the bonus that lifts it above every heavy-hitter score (those span about [-14, 7]: two logs
// bounded below by log(eps)).
DC_HD bool h2o_recent_from_input(float budget_age_input) { return budget_age_input <= -0.69314718f; }
inline constexpr float kH2ORecentBonus = 20.0f;

// H2O's heavy-hitter score written in two of these inputs (the warm start that imitates H2O):
// H2O ranks by the mass summed over the queries, alpha is its mean over the queries that see the
// token, about latest - position of them with every prompt query observed, so
//   log(sum) = log(alpha n) + log(1 - position) + a constant of the group.
DC_HD float h2o_score_from_inputs(float alpha_input, float position_input) {
  const float unseen = 1.0f - position_input;
  return alpha_input + log_poly(unseen > kPolicyInputEps ? unseen : kPolicyInputEps);
}

// The learned policy's H2O base score (MlpPolicy's ScoreBase::h2o): log of the attention mass a
// row accumulated, H2O's own score, so that the MLP's output is a correction in nats to H2O's
// ranking and a policy whose output layer is zero ranks exactly as H2O (as far as log_poly's 2
// ulps keep masses a few ulps apart in order). Masses below 1e-30 (no query saw the row) read as
// 1e-30: finite, and tied with each other as H2O's zeros are.
DC_HD_INLINE float h2o_base_score(float accumulated_mass) {
  constexpr float kFloor = 1e-30f;
  // log(max(mass, floor)) written as a select after the logarithm: the same values, but GCC 12,
  // knowing log_poly's argument was at least the floor, turned its selects into branches and
  // left the scoring loop scalar (a third of a linear correction's scoring time).
  const float log_mass = log_poly(accumulated_mass);
  return accumulated_mass > kFloor ? log_mass : log_poly(kFloor);
}

}  // namespace dc::math
