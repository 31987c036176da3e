#pragma once
// Per-group top-B on the CPU: the deterministic keep-set of inference, or with Gumbel noise an
// ordered Plackett-Luce sample for training (math/plackett_luce.hpp explains why they are one
// sort). cuda/topk.cuh is the same op on the device and returns the same rows in the same order.
//
// Shapes: scores [rows], positions [rows], group_offsets [groups + 1] (group g is rows
// [off[g], off[g + 1])). Each group keeps min(budget, n_g) rows, ordered by the key
// math::topk_sort_key(perturbed score, position) descending, then by ascending row:
//   no noise:   score descending, ties to the older position (then the smaller row);
//   with noise: s_r + math::gumbel_noise(seed, stream, r) descending (r the global row), which
//               is the Plackett-Luce sample order (first pick first).
// Scores may be +-inf; NaN is rejected.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../math/philox.hpp"
#include "../math/plackett_luce.hpp"

namespace dc {
namespace cpu_detail {

// Groups with at least this many rows in total are spread over threads (one group per thread
// at a time, so the result does not depend on the thread count).
inline constexpr std::size_t kTopkParallelFrom = std::size_t(1) << 15;

struct TopkEntry {
  std::uint64_t key;
  std::int32_t row;
};

// Before by the shared ordering: larger key first, then smaller row.
inline bool topk_before(const TopkEntry& a, const TopkEntry& b) {
  return a.key != b.key ? a.key > b.key : a.row < b.row;
}

}  // namespace cpu_detail

inline GroupSamples topk_groups(const Context<cpu>&, std::span<const float> scores,
                                std::span<const std::int32_t> positions,
                                std::span<const std::int32_t> group_offsets, int budget,
                                std::optional<GumbelNoise> noise = std::nullopt) {
  DC_CHECK(positions.size() == scores.size(), "topk_groups: ", scores.size(), " scores for ",
           positions.size(), " positions");
  DC_CHECK(budget >= 0, "topk_groups: negative budget ", budget);
  check_group_offsets(group_offsets, scores.size(), "topk_groups");
  for (std::size_t r = 0; r < scores.size(); ++r)
    DC_CHECK(!std::isnan(scores[r]), "topk_groups: score of row ", r, " is NaN");

  GroupSamples out;
  out.offsets = sample_offsets(group_offsets, budget);
  out.rows.resize(std::size_t(out.offsets.back()));
  const int groups = int(group_offsets.size()) - 1;
  [[maybe_unused]] const bool parallel =
      groups > 1 && scores.size() >= cpu_detail::kTopkParallelFrom;

  // No exception can leave this loop (the checks above cover every input).
  DC_OMP(parallel for schedule(dynamic) if (parallel))
  for (int g = 0; g < groups; ++g) {
    const std::int32_t begin = group_offsets[std::size_t(g)];
    const std::int32_t end = group_offsets[std::size_t(g) + 1];
    const std::int32_t picks = out.offsets[std::size_t(g) + 1] - out.offsets[std::size_t(g)];
    if (picks == 0) continue;
    std::vector<cpu_detail::TopkEntry> entries(std::size_t(end - begin));
    for (std::int32_t r = begin; r < end; ++r) {
      float s = scores[std::size_t(r)];
      if (noise)
        s = math::perturbed_score(s, math::gumbel_noise(noise->seed, noise->stream,
                                                        std::uint64_t(r)));
      entries[std::size_t(r - begin)] = {math::topk_sort_key(s, positions[std::size_t(r)]), r};
    }
    // O(n) selection of the picks, then O(B log B) to order them.
    const auto chosen_end = entries.begin() + picks;
    if (chosen_end != entries.end())
      std::nth_element(entries.begin(), chosen_end, entries.end(), cpu_detail::topk_before);
    std::sort(entries.begin(), chosen_end, cpu_detail::topk_before);
    std::int32_t* dst = out.rows.data() + out.offsets[std::size_t(g)];
    for (std::int32_t j = 0; j < picks; ++j) dst[j] = entries[std::size_t(j)].row;
  }
  return out;
}

}  // namespace dc
