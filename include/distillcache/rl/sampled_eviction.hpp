#pragma once
// Sampled evictions for training: a KeepSetSelector (policy/select.hpp) that draws each group's
// keep-set as an ordered Plackett-Luce sample by Gumbel-top-k, instead of the deterministic
// top-B of inference, and records what the policy-gradient step needs to score the sample again
// (the inputs, the accumulated mass a score base reads, the groups, the picks in order).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "../cpu/topk.hpp"
#include "../policy/mlp_policy.hpp"
#include "../policy/select.hpp"

namespace dc {

// One sampled eviction: the policy's inputs [rows, inputs] of the rows it chose among (every row
// but those it always keeps), their groups [groups + 1] and the ordered picks of each group (rows
// of this record).
struct SampledEviction {
  std::vector<float> inputs;
  std::vector<float> accumulated_mass;  // of the same rows: what a score base reads (ScoreBase)
  float temperature = 1.0f;             // the picks are a Plackett-Luce sample of scores / temperature
  std::vector<std::int32_t> group_offsets;
  GroupSamples picks;
  int rows() const { return group_offsets.empty() ? 0 : group_offsets.back(); }
};

inline std::vector<std::int32_t> group_offsets_of(const TokenFeatures& f) {
  std::vector<std::int32_t> off(1, 0);
  for (const FeatureGroup& g : f.groups) off.push_back(g.row_end);
  return off;
}

// Noise for eviction e of a rollout keyed by (seed, stream_base + e): distinct streams per
// rollout (the trainer makes stream_base unique per update, context, budget and rollout) give
// independent samples; the same key gives the same sample, which makes training repeatable.
//
// explore_groups > 0 samples only that many groups per eviction (chosen at random, keyed the
// same way) and keeps the deterministic top-B of the others, whose picks are not recorded (they
// add nothing to log p). At head granularity an eviction makes ~90 groups x B choices; a single
// scalar reward spread over all of them makes the score-function gradient's variance grow with
// their number, so exploring a few groups at a time gives each rollout's advantage a clear
// meaning (coordinate-wise exploration). The policy optimised is then stochastic in the
// explored groups and greedy elsewhere, which is closer to the greedy policy deployed.
//
// Which groups are explored is keyed on (seed, explore_stream_base + e); by default
// explore_stream_base = stream_base, so every rollout explores its own groups. Giving the K
// rollouts of one (context, budget) the same explore_stream_base makes them explore the same
// groups, so that they differ only there: their leave-one-out baseline then removes how much
// perturbing those groups costs on average (some heads matter far more than others), which with
// groups of their own is left in every advantage as noise (TrainerOptions::shared_exploration).
class GumbelSelector final : public KeepSetSelector {
 public:
  // temperature: the sample is of scores / temperature (Gumbel noise of scale temperature on the
  // scores): below 1 it stays closer to the greedy top-B deployed, swapping rows near each
  // group's boundary rather than across the whole ranking.
  GumbelSelector(const MlpPolicy& policy, std::uint64_t seed, std::uint64_t stream_base,
                 int explore_groups = 0, float temperature = 1.0f,
                 std::optional<std::uint64_t> explore_stream_base = std::nullopt)
      : policy_(policy), seed_(seed), stream_base_(stream_base),
        explore_stream_base_(explore_stream_base.value_or(stream_base)), explore_groups_(explore_groups),
        temperature_(temperature) {
    DC_CHECK(explore_groups >= 0, "sampled eviction: negative explore_groups ", explore_groups);
    DC_CHECK(std::isfinite(temperature) && temperature > 0.0f, "sampled eviction: temperature ",
             temperature, " must be finite and > 0");
  }

  // Rows the policy scored +inf (MlpPolicy's recent window and newest-query reserve) are kept
  // without a choice: the sample, and the record the gradient reads, cover only the other rows,
  // with the budget less the forced rows of that group. Groups may force different counts (a
  // reserve limited to some layers): all are sampled to the largest free budget and each keeps
  // the first picks of its ordered sample, which is itself an ordered Plackett-Luce sample of
  // that size (the record holds those picks only).
  KeepSets select(const TokenFeatures& f, std::span<const float> scores, int budget, int sink,
                  int recent) override {
    DC_CHECK(sink == 0 && recent == 0, "sampled eviction: protected sink (", sink, ") and recent (",
             recent, ") tokens are not supported while training; the policy learns what to keep");
    const int group_count = int(f.groups.size());
    std::vector<std::int32_t> candidates, forced;  // global rows, group by group
    std::vector<std::int32_t> forced_offsets(1, 0);
    SampledEviction e;
    e.temperature = temperature_;
    e.group_offsets.assign(1, 0);
    std::vector<int> free_budgets;  // per group: the budget less its forced rows
    for (const FeatureGroup& g : f.groups) {
      for (int r = g.row_begin; r < g.row_end; ++r)
        (scores[std::size_t(r)] == INFINITY ? forced : candidates).push_back(r);
      free_budgets.push_back(std::max(0, budget - (int(forced.size()) - forced_offsets.back())));
      forced_offsets.push_back(std::int32_t(forced.size()));
      e.group_offsets.push_back(std::int32_t(candidates.size()));
    }
    const int free_budget = free_budgets.empty() ? 0 : *std::max_element(free_budgets.begin(), free_budgets.end());
    const std::vector<float> all_inputs = policy_inputs(f, policy_.inputs(), budget);
    const std::size_t k = policy_.inputs().size();
    std::vector<float> candidate_scores;
    std::vector<std::int32_t> candidate_positions;
    for (std::int32_t r : candidates) {
      e.inputs.insert(e.inputs.end(), all_inputs.begin() + std::ptrdiff_t(std::size_t(r) * k),
                      all_inputs.begin() + std::ptrdiff_t(std::size_t(r + 1) * k));
      e.accumulated_mass.push_back(f.accumulated_mass[std::size_t(r)]);
      candidate_scores.push_back(scores[std::size_t(r)] / temperature_);
      candidate_positions.push_back(f.position[std::size_t(r)]);
    }

    const std::uint64_t stream = stream_base_ + std::uint64_t(records_.size());
    const GroupSamples sampled = topk_groups(Context<cpu>{}, candidate_scores, candidate_positions,
                                             e.group_offsets, free_budget, GumbelNoise{seed_, stream});
    std::vector<char> explored(std::size_t(group_count), 1);
    GroupSamples greedy;
    if (explore_groups_ > 0 && explore_groups_ < group_count) {
      greedy = topk_groups(Context<cpu>{}, candidate_scores, candidate_positions, e.group_offsets,
                           free_budget);
      std::vector<int> order(static_cast<std::size_t>(group_count));
      std::iota(order.begin(), order.end(), 0);
      const std::uint64_t explore_stream = explore_stream_base_ + std::uint64_t(records_.size());
      std::mt19937_64 rng(seed_ ^ (explore_stream * 0x9E3779B97F4A7C15ull));
      std::shuffle(order.begin(), order.end(), rng);
      std::fill(explored.begin(), explored.end(), 0);
      for (int i = 0; i < explore_groups_; ++i) explored[std::size_t(order[std::size_t(i)])] = 1;
    }
    KeepSets keep(f.groups.size());
    e.picks.offsets.assign(1, 0);
    for (int g = 0; g < group_count; ++g) {
      const auto ordered = explored[std::size_t(g)] ? sampled.group(g) : greedy.group(g);
      const auto rows = ordered.first(std::min(ordered.size(), std::size_t(free_budgets[std::size_t(g)])));
      auto& kept = keep[std::size_t(g)];
      for (std::int32_t row : rows) kept.push_back(f.slot[std::size_t(candidates[std::size_t(row)])]);
      for (std::int32_t i = forced_offsets[std::size_t(g)]; i < forced_offsets[std::size_t(g) + 1]; ++i)
        kept.push_back(f.slot[std::size_t(forced[std::size_t(i)])]);
      std::sort(kept.begin(), kept.end());
      if (explored[std::size_t(g)]) e.picks.rows.insert(e.picks.rows.end(), rows.begin(), rows.end());
      e.picks.offsets.push_back(std::int32_t(e.picks.rows.size()));
    }
    records_.push_back(std::move(e));
    return keep;
  }

  const std::vector<SampledEviction>& records() const { return records_; }

 private:
  const MlpPolicy& policy_;
  std::uint64_t seed_, stream_base_, explore_stream_base_;
  int explore_groups_;
  float temperature_;
  std::vector<SampledEviction> records_;
};

}  // namespace dc
