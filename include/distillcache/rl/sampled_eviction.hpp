#pragma once
// Sampled evictions for training: a KeepSetSelector (policy/select.hpp) that draws each group's
// keep-set as an ordered Plackett-Luce sample by Gumbel-top-k, instead of the deterministic
// top-B of inference, and records what the policy-gradient step needs to score the sample again
// (the inputs, the groups, the picks in order).
#include <cstdint>
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
class GumbelSelector final : public KeepSetSelector {
 public:
  GumbelSelector(const MlpPolicy& policy, std::uint64_t seed, std::uint64_t stream_base)
      : policy_(policy), seed_(seed), stream_base_(stream_base) {}

  KeepSets select(const TokenFeatures& f, std::span<const float> scores, int budget, int sink,
                  int recent) override {
    DC_CHECK(sink == 0 && recent == 0, "sampled eviction: protected sink (", sink, ") and recent (",
             recent, ") tokens are not supported while training; the policy learns what to keep");
    SampledEviction e;
    e.inputs = policy_inputs(f, policy_.inputs());
    e.group_offsets = group_offsets_of(f);
    e.picks = topk_groups(Context<cpu>{}, scores, f.position, e.group_offsets, budget,
                          GumbelNoise{seed_, stream_base_ + std::uint64_t(records_.size())});
    KeepSets keep(f.groups.size());
    for (int g = 0; g < e.picks.groups(); ++g) {
      auto& k = keep[std::size_t(g)];
      for (std::int32_t row : e.picks.group(g)) k.push_back(f.slot[std::size_t(row)]);
      std::sort(k.begin(), k.end());
    }
    records_.push_back(std::move(e));
    return keep;
  }

  const std::vector<SampledEviction>& records() const { return records_; }

 private:
  const MlpPolicy& policy_;
  std::uint64_t seed_, stream_base_;
  std::vector<SampledEviction> records_;
};

}  // namespace dc
