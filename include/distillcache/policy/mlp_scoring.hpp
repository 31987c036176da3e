#pragma once
// The learned policy's scores at inference on the CPU: every row's inputs are built straight into
// the MLP's tile layout ([inputs, kMlpTile], policy/policy_inputs.hpp's fill_policy_input) and
// the tile goes through the MLP at once (cpu/mlp.hpp's mlp_tile_layers). The trainer's path
// (policy_inputs, then mlp_forward) first writes an [n, inputs] matrix and then transposes it
// into tiles; inference keeps nothing for a backward, so it skips the matrix: at 737k rows
// (SmolLM2 at 8k, one keep-set per KV head) the scores are the same bits (each row's arithmetic
// is the same; tested) for less memory traffic.
//
// Work is split into tiles of one group each (a group's inputs are relative to its own rows), so
// even one shared group spreads over every thread.
//
// recent: rows whose position is among the newest `recent` (position > latest - recent) score
// +inf, as MlpPolicy's recent window keeps them whatever the MLP says, and a tile holding only
// such rows skips the MLP: in the decoder's eviction of B + 16 rows back to B with the newest
// half of B kept, that is nearly half of every group. Pinned rows (below) count as recent ones.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/backend.hpp"
#include "../cpu/mlp.hpp"
#include "../cpu/parallel.hpp"
#include "../math/policy_inputs.hpp"
#include "policy_inputs.hpp"

namespace dc {

// What the MLP's output is added to (MlpPolicy::set_score_base). none: the score is the MLP's
// output. h2o: log of H2O's accumulated mass plus the MLP's output (math::h2o_base_score), a
// residual on H2O's ranking: with a zero output layer the policy is H2O, so training starts from
// the best heuristic exactly instead of from an imperfect fit of it, and every REINFORCE step
// changes H2O's choices only where the rollouts said so.
enum class ScoreBase : int { none = 0, h2o };

inline const char* score_base_name(ScoreBase b) { return b == ScoreBase::h2o ? "h2o" : "none"; }

inline ScoreBase parse_score_base(std::string_view name) {
  if (name == "none") return ScoreBase::none;
  if (name == "h2o") return ScoreBase::h2o;
  DC_FAIL("unknown score base '", std::string(name), "' (known: none, h2o)");
}

// scores[i] += the base score of row row0 + i, i < rows (nothing for ScoreBase::none). The same
// float addition after the MLP on every path (inference, trainer, policy gradient), so their
// scores stay the same bits.
inline void add_score_base(ScoreBase base, const float* DC_RESTRICT accumulated_mass, int rows,
                           float* DC_RESTRICT scores) {
  if (base == ScoreBase::none) return;
  for (int i = 0; i < rows; ++i) scores[i] += math::h2o_base_score(accumulated_mass[i]);
}

// pinned: empty, or a flag per position (newest_query_pins.hpp's pinned_positions): rows at a
// flagged position score +inf like the recent window's. Here rather than in a pass of their own
// because this loop reads every row's position anyway; that pass over 737k rows (SmolLM2 at 8k,
// head granularity) was most of the pins' cost.
// unscored: empty, or a flag per group: a flagged group's rows score 0 without the MLP, for a
// caller that rescores the whole group afterwards (MlpPolicy's newest-query layers).
inline void mlp_policy_scores(const TokenFeatures& f, std::span<const PolicyInput> inputs, int budget,
                              const MlpLayout& layout, const float* params, std::span<float> scores,
                              int recent = 0, ScoreBase base = ScoreBase::none,
                              std::span<const char> pinned = {}, std::span<const char> unscored = {}) {
  DC_CHECK(layout.inputs == int(inputs.size()), "mlp_policy_scores: the MLP takes ", layout.inputs,
           " inputs, ", inputs.size(), " asked for");
  DC_CHECK(scores.size() >= std::size_t(f.size), "mlp_policy_scores: ", scores.size(),
           " scores for ", f.size, " rows");
  DC_CHECK(recent >= 0, "mlp_policy_scores: negative recent window ", recent);
  DC_CHECK(unscored.empty() || unscored.size() == f.groups.size(), "mlp_policy_scores: ", unscored.size(),
           " group flags for ", f.groups.size(), " groups");
  const std::vector<float> layer_last = prepare_policy_inputs(f, inputs, budget);
  constexpr int T = cpu_detail::kMlpTile;
  const int groups = f.num_groups(), layers = policy_input_layers(f);
  std::vector<PolicyInputScale> scale(static_cast<std::size_t>(groups));
  // first_tile[g]: the index of group g's first tile, tiles numbered group after group.
  std::vector<std::int64_t> first_tile(std::size_t(groups) + 1, 0);
  for (int g = 0; g < groups; ++g)
    first_tile[std::size_t(g) + 1] = first_tile[std::size_t(g)] + (f.groups[std::size_t(g)].rows() + T - 1) / T;
  DC_OMP(parallel for schedule(dynamic) if (groups > 1 && f.size > 4096))
  for (int g = 0; g < groups; ++g) scale[std::size_t(g)] = policy_input_scale(f, g, layers);
  const std::int64_t count = first_tile.back();
  const std::uint32_t pins = std::uint32_t(pinned.size());
  // The flags as 32-bit integers, so that the tile loop below looks them up with vector gathers
  // (as bytes the lookup stayed scalar). Still about 0.4 ms over 737k rows (SmolLM2 at 8k, head
  // granularity): pins lie anywhere, so every row is looked up.
  const std::vector<std::int32_t> pin_flags(pinned.begin(), pinned.end());
  const std::int32_t* pin_flag = pin_flags.data();
  const int newest_unforced = f.latest_position - recent;
  const std::size_t width = std::size_t(layout.widest()) * T;
  // An input whose first-layer weights are all zero adds nothing (0 times a finite input): it is
  // not built. A linear correction (policy/linear_correction.hpp) typically reads a few of its
  // inputs, and the logarithms of the others were most of its scoring time.
  std::vector<char> used(std::size_t(layout.inputs), 0);
  for (int o = 0; o < layout.out(0); ++o)
    for (int i = 0; i < layout.inputs; ++i)
      used[std::size_t(i)] |= params[layout.weight_offset(0) + std::int64_t(o) * layout.inputs + i] != 0.0f;
  DC_OMP(parallel if (count > 64))
  {
    std::vector<float> a(width), z(width);
    DC_OMP(for schedule(static))
    for (std::int64_t t = 0; t < count; ++t) {
      const int g = int(std::upper_bound(first_tile.begin(), first_tile.end(), t) - first_tile.begin()) - 1;
      const FeatureGroup& group = f.groups[std::size_t(g)];
      const int row0 = group.row_begin + int(t - first_tile[std::size_t(g)]) * T;
      const int rows = std::min(T, group.row_end - row0);
      if (!unscored.empty() && unscored[std::size_t(g)]) {
        std::fill(scores.data() + row0, scores.data() + row0 + rows, 0.0f);
        continue;
      }
      const std::int32_t* position = f.position.data() + row0;
      std::int32_t forced[T];  // rows of the tile in the recent window or pinned (loops without branches)
      for (int r = 0; r < rows; ++r) forced[r] = position[r] > newest_unforced ? 1 : 0;
      if (pins > 0)
        for (int r = 0; r < rows; ++r) {  // a position outside [0, latest] is no pin
          const std::uint32_t p = std::uint32_t(position[r]);
          forced[r] |= pin_flag[std::min(p, pins - 1)] & (p < pins ? 1 : 0);  // an unconditional load
        }
      int in_window = 0;
      for (int r = 0; r < rows; ++r) in_window += forced[r];
      if (in_window == rows) {
        std::fill(scores.data() + row0, scores.data() + row0 + rows, INFINITY);
        continue;
      }
      for (int i = 0; i < layout.inputs; ++i) {
        float* column = a.data() + std::size_t(i) * T;
        if (!used[std::size_t(i)]) {
          std::fill(column, column + T, 0.0f);
          continue;
        }
        fill_policy_input(f, inputs[std::size_t(i)], scale[std::size_t(g)], layer_last.data(), budget, row0,
                          rows, column);
        std::fill(column + rows, column + T, 0.0f);  // as mlp_tile_forward pads a short tile
      }
      cpu_detail::mlp_tile_layers(layout, params, row0, rows, scores.data(), nullptr, a.data(), z.data());
      add_score_base(base, f.accumulated_mass.data() + row0, rows, scores.data() + row0);
      if (in_window > 0) {  // a blend, not a branch: pinned rows lie anywhere in a tile
        float* tile_scores = scores.data() + row0;
        for (int r = 0; r < rows; ++r) tile_scores[r] = forced[r] ? INFINITY : tile_scores[r];
      }
    }
  }
}

}  // namespace dc
