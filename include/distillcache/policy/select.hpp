#pragma once
// Top-B selection: the B highest-scoring slots as an ascending keep-set, with protected sink and
// recent tokens always kept. Ties go to the older slot, so selection is deterministic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "../cache/keep_sets.hpp"
#include "../core/error.hpp"

namespace dc {

// positions[i] is slot i's position (ascending in slot order is not assumed).
inline std::vector<std::int32_t> select_keep(std::span<const float> scores,
                                             std::span<const std::int32_t> positions, int budget,
                                             int sink = 0, int recent = 0) {
  const int n = static_cast<int>(scores.size());
  DC_CHECK(positions.size() == scores.size(), "select_keep: ", scores.size(), " scores for ",
           positions.size(), " positions");
  DC_CHECK(budget >= 0, "select_keep: negative budget ", budget);
  DC_CHECK(sink >= 0 && recent >= 0, "select_keep: sink ", sink, " and recent ", recent,
           " must be >= 0");
  DC_CHECK(std::int64_t(sink) + recent <= budget || budget >= n, "select_keep: ", sink, " sink + ",
           recent, " recent protected slots exceed the budget of ", budget);
  for (int i = 0; i < n; ++i)
    DC_CHECK(!std::isnan(scores[std::size_t(i)]), "select_keep: score of slot ", i, " is NaN");
  std::vector<std::int32_t> keep(static_cast<std::size_t>(n));
  std::iota(keep.begin(), keep.end(), 0);
  if (budget >= n) return keep;

  // Protected: the `sink` oldest and `recent` newest positions.
  std::vector<std::int32_t> by_position = keep;
  std::sort(by_position.begin(), by_position.end(),
            [&](std::int32_t a, std::int32_t b) { return positions[std::size_t(a)] < positions[std::size_t(b)]; });
  std::vector<char> is_protected(std::size_t(n), 0);
  for (int i = 0; i < std::min(sink, n); ++i) is_protected[std::size_t(by_position[std::size_t(i)])] = 1;
  for (int i = std::max(0, n - recent); i < n; ++i) is_protected[std::size_t(by_position[std::size_t(i)])] = 1;

  auto better = [&](std::int32_t a, std::int32_t b) {
    if (is_protected[std::size_t(a)] != is_protected[std::size_t(b)]) return is_protected[std::size_t(a)] > is_protected[std::size_t(b)];
    if (scores[std::size_t(a)] != scores[std::size_t(b)]) return scores[std::size_t(a)] > scores[std::size_t(b)];
    return positions[std::size_t(a)] < positions[std::size_t(b)];
  };
  std::nth_element(keep.begin(), keep.begin() + budget, keep.end(), better);
  keep.resize(std::size_t(budget));
  std::sort(keep.begin(), keep.end());
  return keep;
}

// The top-B of every group of f (scores: one per row), as kept slots in ascending order per
// group (compact_groups applies them). sink and recent protect positions within each group.
inline KeepSets select_keep_groups(std::span<const float> scores, const TokenFeatures& f,
                                   int budget, int sink = 0, int recent = 0) {
  DC_CHECK(scores.size() == std::size_t(f.size), "select_keep_groups: ", scores.size(),
           " scores for ", f.size, " rows");
  KeepSets keep(f.groups.size());
  for (std::size_t g = 0; g < f.groups.size(); ++g) {
    const FeatureGroup& group = f.groups[g];
    const auto rows = std::size_t(group.row_begin), n = std::size_t(group.rows());
    auto chosen = select_keep(scores.subspan(rows, n),
                              std::span<const std::int32_t>(f.position).subspan(rows, n), budget,
                              sink, recent);
    for (auto& r : chosen) r = f.slot[rows + std::size_t(r)];  // row in group -> slot
    keep[g] = std::move(chosen);
  }
  return keep;
}

// How a keep-set is chosen from a policy's scores, for callers that need something other than
// the deterministic top-B (the trainer samples keep-sets by Gumbel-top-k and records them).
class KeepSetSelector {
 public:
  virtual ~KeepSetSelector() = default;
  // One ascending keep-set of `budget` slots per group of f (fewer where a group has fewer rows).
  virtual KeepSets select(const TokenFeatures& f, std::span<const float> scores, int budget,
                          int sink, int recent) = 0;
};

}  // namespace dc
