#pragma once
// Sampled evictions for training: a KeepSetSelector (policy/select.hpp) that draws each group's
// keep-set as an ordered Plackett-Luce sample by Gumbel-top-k, instead of the deterministic
// top-B of inference, and records what the policy-gradient step needs to score the sample again
// (the inputs, the groups, the picks in order).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "../cpu/topk.hpp"
#include "../policy/mlp_policy.hpp"
#include "../policy/select.hpp"

namespace dc {

// One sampled eviction: the policy's inputs [rows, inputs] when it chose, its groups
// [groups + 1] and the ordered picks of each group (global rows).
struct SampledEviction {
  std::vector<float> inputs;
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
class GumbelSelector final : public KeepSetSelector {
 public:
  GumbelSelector(const MlpPolicy& policy, std::uint64_t seed, std::uint64_t stream_base,
                 int explore_groups = 0)
      : policy_(policy), seed_(seed), stream_base_(stream_base), explore_groups_(explore_groups) {
    DC_CHECK(explore_groups >= 0, "sampled eviction: negative explore_groups ", explore_groups);
  }

  KeepSets select(const TokenFeatures& f, std::span<const float> scores, int budget, int sink,
                  int recent) override {
    DC_CHECK(sink == 0 && recent == 0, "sampled eviction: protected sink (", sink, ") and recent (",
             recent, ") tokens are not supported while training; the policy learns what to keep");
    SampledEviction e;
    e.inputs = policy_inputs(f, policy_.inputs());
    e.group_offsets = group_offsets_of(f);
    const std::uint64_t stream = stream_base_ + std::uint64_t(records_.size());
    const GroupSamples sampled = topk_groups(Context<cpu>{}, scores, f.position, e.group_offsets,
                                             budget, GumbelNoise{seed_, stream});
    const int groups = sampled.groups();
    std::vector<char> explored(std::size_t(groups), 1);
    GroupSamples greedy;
    if (explore_groups_ > 0 && explore_groups_ < groups) {
      greedy = topk_groups(Context<cpu>{}, scores, f.position, e.group_offsets, budget);
      std::vector<int> order(static_cast<std::size_t>(groups));
      std::iota(order.begin(), order.end(), 0);
      std::mt19937_64 rng(seed_ ^ (stream * 0x9E3779B97F4A7C15ull));
      std::shuffle(order.begin(), order.end(), rng);
      std::fill(explored.begin(), explored.end(), 0);
      for (int i = 0; i < explore_groups_; ++i) explored[std::size_t(order[std::size_t(i)])] = 1;
    }
    KeepSets keep(f.groups.size());
    e.picks.offsets.assign(1, 0);
    for (int g = 0; g < groups; ++g) {
      const auto rows = explored[std::size_t(g)] ? sampled.group(g) : greedy.group(g);
      auto& k = keep[std::size_t(g)];
      for (std::int32_t row : rows) k.push_back(f.slot[std::size_t(row)]);
      std::sort(k.begin(), k.end());
      if (explored[std::size_t(g)]) e.picks.rows.insert(e.picks.rows.end(), rows.begin(), rows.end());
      e.picks.offsets.push_back(std::int32_t(e.picks.rows.size()));
    }
    records_.push_back(std::move(e));
    return keep;
  }

  const std::vector<SampledEviction>& records() const { return records_; }

 private:
  const MlpPolicy& policy_;
  std::uint64_t seed_, stream_base_;
  int explore_groups_;
  std::vector<SampledEviction> records_;
};

}  // namespace dc
