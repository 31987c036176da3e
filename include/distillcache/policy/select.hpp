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
#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../cpu/parallel.hpp"

namespace dc {

namespace detail {

// The checks of select_keep, apart so that a parallel caller can run them first (nothing may
// throw inside an OpenMP region).
inline void check_selection(std::span<const float> scores, std::span<const std::int32_t> positions,
                            int budget, int sink, int recent) {
  const auto n = scores.size();
  DC_CHECK(positions.size() == n, "select_keep: ", n, " scores for ", positions.size(), " positions");
  DC_CHECK(budget >= 0, "select_keep: negative budget ", budget);
  DC_CHECK(sink >= 0 && recent >= 0, "select_keep: sink ", sink, " and recent ", recent,
           " must be >= 0");
  DC_CHECK(std::int64_t(sink) + recent <= budget || std::size_t(budget) >= n, "select_keep: ", sink,
           " sink + ", recent, " recent protected slots exceed the budget of ", budget);
  bool any_nan = false;  // an OR that vectorises; the loop naming the slot runs only on a NaN
  for (std::size_t i = 0; i < n; ++i) any_nan |= scores[i] != scores[i];
  if (!any_nan) return;
  for (std::size_t i = 0; i < n; ++i)
    DC_CHECK(!std::isnan(scores[i]), "select_keep: score of slot ", i, " is NaN");
}

// The slots not among the `drop` worst under `better` (a strict total order), ascending: for a
// decode-time eviction, which drops a chunk of 16 of 2064 slots, one pass comparing each slot
// with the best of the worst found so far (a heap of `drop`) is several times cheaper than
// nth_element over all of them. The same set as nth_element's first n - drop under that order.
//
// scores and protection (null: nothing protected) are what `better` compares first: a slot
// scoring above the heap's front while nothing is protected cannot be worse than it, and the
// loop passes it without calling `better` (most slots, at every eviction).
//
// The heap starts from the first `drop` slots scoring below +inf (then the first others), not
// from the first `drop` slots: any `drop` slots give the same result, but a policy that forces
// most rows to +inf (the learned policy's recent window, reserves and pins: 88 % of the rows
// at 50 % of 4096) put +inf slots in the heap, and then every later +inf slot tied with its
// front, failed the shortcut and went through `better` and the heap (ties go to the older
// slot, so a newer one replaced the front): its selection took 4-5 times H2O's.
template <class Better>
std::vector<std::int32_t> keep_all_but_worst(std::span<const float> scores, const char* protection, int n,
                                             int drop, Better better) {
  // A heap whose front is the best of the worst found so far: "less" is "worse".
  auto worse = [&](std::int32_t a, std::int32_t b) { return better(b, a); };
  std::vector<std::int32_t> seeds;  // the heap's first slots, ascending
  seeds.reserve(std::size_t(drop));
  for (std::int32_t i = 0; i < n && int(seeds.size()) < drop; ++i)
    if (scores[std::size_t(i)] != INFINITY) seeds.push_back(i);
  if (int(seeds.size()) < drop) {  // every slot below +inf is in: the first +inf ones too
    for (std::int32_t i = 0; i < n && int(seeds.size()) < drop; ++i)
      if (scores[std::size_t(i)] == INFINITY) seeds.push_back(i);
    std::sort(seeds.begin(), seeds.end());
  }
  std::vector<std::int32_t> worst(seeds);
  std::make_heap(worst.begin(), worst.end(), worse);
  float front_score = scores[std::size_t(worst.front())];
  std::size_t next_seed = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    if (next_seed < seeds.size() && seeds[next_seed] == i) {  // already in the heap
      ++next_seed;
      continue;
    }
    if (protection == nullptr && scores[std::size_t(i)] > front_score) continue;
    if (better(worst.front(), i)) {
      std::pop_heap(worst.begin(), worst.end(), worse);
      worst.back() = i;
      std::push_heap(worst.begin(), worst.end(), worse);
      front_score = scores[std::size_t(worst.front())];
    }
  }
  std::sort(worst.begin(), worst.end());  // the dropped slots, ascending: keep the runs between
  std::vector<std::int32_t> keep(std::size_t(n - drop));
  std::size_t out = 0;
  std::int32_t slot = 0;
  for (const std::int32_t dropped : worst) {
    for (; slot < dropped; ++slot) keep[out++] = slot;
    ++slot;
  }
  for (; slot < n; ++slot) keep[out++] = slot;
  return keep;
}

// select_keep on checked arguments; does not throw (but for memory).
inline std::vector<std::int32_t> top_budget(std::span<const float> scores,
                                            std::span<const std::int32_t> positions, int budget,
                                            int sink, int recent) {
  const int n = static_cast<int>(scores.size());
  if (budget >= n) {
    std::vector<std::int32_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }

  // Protected: the `sink` oldest and `recent` newest positions (none by default: no sort).
  std::vector<char> is_protected;
  if (sink > 0 || recent > 0) {
    is_protected.assign(std::size_t(n), 0);
    std::vector<std::int32_t> by_position(static_cast<std::size_t>(n));
    std::iota(by_position.begin(), by_position.end(), 0);
    std::sort(by_position.begin(), by_position.end(), [&](std::int32_t a, std::int32_t b) {
      return positions[std::size_t(a)] < positions[std::size_t(b)];
    });
    for (int i = 0; i < std::min(sink, n); ++i) is_protected[std::size_t(by_position[std::size_t(i)])] = 1;
    for (int i = std::max(0, n - recent); i < n; ++i) is_protected[std::size_t(by_position[std::size_t(i)])] = 1;
  }
  const char* protection = is_protected.empty() ? nullptr : is_protected.data();
  // A strict total order (the slot decides equal positions, which a cache never holds), so the
  // kept set does not depend on the algorithm that finds it.
  auto better = [&](std::int32_t a, std::int32_t b) {
    if (protection && protection[a] != protection[b]) return protection[a] > protection[b];
    if (scores[std::size_t(a)] != scores[std::size_t(b)]) return scores[std::size_t(a)] > scores[std::size_t(b)];
    if (positions[std::size_t(a)] != positions[std::size_t(b)]) return positions[std::size_t(a)] < positions[std::size_t(b)];
    return a < b;
  };
  if (const int drop = n - budget; drop <= n / 16) return keep_all_but_worst(scores, protection, n, drop, better);
  std::vector<std::int32_t> keep(static_cast<std::size_t>(n));
  std::iota(keep.begin(), keep.end(), 0);
  std::nth_element(keep.begin(), keep.begin() + budget, keep.end(), better);
  // The first B are the kept slots; listing them in ascending order through a mask is linear,
  // where sorting them is not (a prompt compressed to 25 % keeps 2048 of 8191).
  std::vector<char> kept(std::size_t(n), 0);
  for (int i = 0; i < budget; ++i) kept[std::size_t(keep[std::size_t(i)])] = 1;
  keep.clear();
  for (int slot = 0; slot < n; ++slot)
    if (kept[std::size_t(slot)]) keep.push_back(slot);
  return keep;
}

}  // namespace detail

// positions[i] is slot i's position (ascending in slot order is not assumed).
inline std::vector<std::int32_t> select_keep(std::span<const float> scores,
                                             std::span<const std::int32_t> positions, int budget,
                                             int sink = 0, int recent = 0) {
  detail::check_selection(scores, positions, budget, sink, recent);
  return detail::top_budget(scores, positions, budget, sink, recent);
}

namespace detail {

// The top-budgets[g] of every group g of f, as ascending kept slots per group.
inline KeepSets select_groups(std::span<const float> scores, const TokenFeatures& f,
                              std::span<const int> budgets, int sink, int recent) {
  DC_CHECK(scores.size() == std::size_t(f.size), "select_keep_groups: ", scores.size(),
           " scores for ", f.size, " rows");
  const int groups = f.num_groups();
  auto group_scores = [&](int g) {
    const FeatureGroup& group = f.groups[std::size_t(g)];
    return scores.subspan(std::size_t(group.row_begin), std::size_t(group.rows()));
  };
  auto group_positions = [&](int g) {
    const FeatureGroup& group = f.groups[std::size_t(g)];
    return std::span<const std::int32_t>(f.position).subspan(std::size_t(group.row_begin),
                                                             std::size_t(group.rows()));
  };
  for (int g = 0; g < groups; ++g)
    check_selection(group_scores(g), group_positions(g), budgets[std::size_t(g)], sink, recent);
  KeepSets keep(f.groups.size());
  // Each thread the groups of its contiguous share of the rows, whose scores it wrote
  // (cpu_detail::contiguous_share).
  DC_OMP(parallel if (groups > 1 && f.size > 4096))
  {
    const int thread = cpu_detail::thread_num(), threads = cpu_detail::num_threads();
    for (int g = 0; g < groups; ++g) {
      const FeatureGroup& group = f.groups[std::size_t(g)];
      if (cpu_detail::contiguous_share(group.row_begin, group.row_end, f.size, threads) != thread) continue;
      auto chosen = top_budget(group_scores(g), group_positions(g), budgets[std::size_t(g)], sink, recent);
      for (auto& r : chosen) r = f.slot[std::size_t(group.row_begin) + std::size_t(r)];  // row in group -> slot
      keep[std::size_t(g)] = std::move(chosen);
    }
  }
  return keep;
}

}  // namespace detail

// The top-B of every group of f (scores: one per row), as kept slots in ascending order per
// group (compact_groups applies them). sink and recent protect positions within each group.
// Groups are independent: checked first, then selected in parallel.
inline KeepSets select_keep_groups(std::span<const float> scores, const TokenFeatures& f,
                                   int budget, int sink = 0, int recent = 0) {
  const std::vector<int> budgets(f.groups.size(), budget);
  return detail::select_groups(scores, f, budgets, sink, recent);
}

// The same with a budget per layer (math/layer_budgets.hpp): a group keeps layer_budgets[l] of
// the layer l it covers. A group covering several layers (a shared keep-set) needs them all to
// have the same budget.
inline KeepSets select_keep_groups(std::span<const float> scores, const TokenFeatures& f,
                                   std::span<const int> layer_budgets, int sink = 0, int recent = 0) {
  std::vector<int> budgets;
  for (const FeatureGroup& g : f.groups) {
    DC_CHECK(g.layer_begin >= 0 && g.layer_end <= int(layer_budgets.size()) && g.layer_begin < g.layer_end,
             "select_keep_groups: a group covers layers ", g.layer_begin, " to ", g.layer_end - 1, ", ",
             layer_budgets.size(), " layer budgets given");
    const int b = layer_budgets[std::size_t(g.layer_begin)];
    for (int l = g.layer_begin + 1; l < g.layer_end; ++l)
      DC_CHECK(layer_budgets[std::size_t(l)] == b, "select_keep_groups: a keep-set shared by layers ",
               g.layer_begin, " to ", g.layer_end - 1, " cannot keep ", b, " slots in layer ", g.layer_begin,
               " and ", layer_budgets[std::size_t(l)], " in layer ", l, " (per-layer budgets need the layer or "
               "head granularity)");
    budgets.push_back(b);
  }
  return detail::select_groups(scores, f, budgets, sink, recent);
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
