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
// Only rows the policy's rules leave open are scored: mark_forced_rows gives +inf to the recent
// window's rows and the pinned ones, MlpPolicy's reserves raise more rows to +inf, and
// mlp_score_open_rows then runs the MLP on what is left. In the decoder's eviction of B + 16
// rows back to B with the newest half of B kept, the window alone is nearly half of every group.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/backend.hpp"
#include "../cpu/gather_pack.hpp"
#include "../cpu/mlp.hpp"
#include "../cpu/parallel.hpp"
#include "../math/policy_inputs.hpp"
#include "linear_correction.hpp"
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

namespace detail {

// mark_forced_rows' rule for one group at a time: rows in the recent window or at a pinned
// position score +inf, the others 0.
class ForcedRows {
 public:
  ForcedRows(const TokenFeatures& f, int recent, std::span<const char> pinned)
      : pin_flags_(pinned.begin(), pinned.end()), newest_unforced_(f.latest_position - recent) {}

  // pin: the caller's scratch (a row's flag).
  void mark_group(const TokenFeatures& f, int g, std::vector<std::int32_t>& pin, std::span<float> scores) const {
    const FeatureGroup& group = f.groups[std::size_t(g)];
    float* DC_RESTRICT score = scores.data() + group.row_begin;
    const int rows = group.rows();
    const std::int32_t* DC_RESTRICT position = f.position.data() + group.row_begin;
    const int newest_unforced = newest_unforced_;
    if (pin_flags_.empty()) {
      for (int r = 0; r < rows; ++r) score[r] = position[r] > newest_unforced ? INFINITY : 0.0f;
      return;
    }
    pin.resize(std::size_t(rows));  // every entry written by the lookup
    cpu_detail::lookup_position_flags(pin_flags_.data(), std::uint32_t(pin_flags_.size()), position, rows, pin.data());
    const std::int32_t* DC_RESTRICT pinned_row = pin.data();
    for (int r = 0; r < rows; ++r)
      score[r] = ((position[r] > newest_unforced) | (pinned_row[r] != 0)) ? INFINITY : 0.0f;
  }

 private:
  // The flags as 32-bit integers, looked up a vector at a time (cpu/gather_pack.hpp): pins lie
  // anywhere, so every row is looked up.
  std::vector<std::int32_t> pin_flags_;
  int newest_unforced_;
};

}  // namespace detail

// Marks the rows a policy's rules keep whatever the MLP says: rows among the newest `recent`
// positions (position > latest - recent) and rows at a pinned position score +inf; every other
// row 0, open for mlp_score_open_rows. Every row of a group flagged in `unscored` scores 0.
// pinned: empty, or a flag per position (newest_query_pins.hpp's pinned_positions; a position
// outside it is no pin). unscored: empty, or a flag per group (MlpPolicy's newest-query layers,
// which it rescores whole afterwards).
inline void mark_forced_rows(const TokenFeatures& f, int recent, std::span<const char> pinned,
                             std::span<const char> unscored, std::span<float> scores) {
  DC_CHECK(scores.size() >= std::size_t(f.size), "mark_forced_rows: ", scores.size(), " scores for ", f.size,
           " rows");
  DC_CHECK(recent >= 0, "mark_forced_rows: negative recent window ", recent);
  DC_CHECK(unscored.empty() || unscored.size() == f.groups.size(), "mark_forced_rows: ", unscored.size(),
           " group flags for ", f.groups.size(), " groups");
  const int groups = f.num_groups();
  const detail::ForcedRows forced(f, recent, pinned);
  DC_OMP(parallel if (groups > 1 && f.size > 4096))
  {
    std::vector<std::int32_t> pin;  // per row of a group
    DC_OMP(for schedule(static))
    for (int g = 0; g < groups; ++g) {
      if (!unscored.empty() && unscored[std::size_t(g)]) {
        const FeatureGroup& group = f.groups[std::size_t(g)];
        std::fill(scores.begin() + group.row_begin, scores.begin() + group.row_end, 0.0f);
        continue;
      }
      forced.mark_group(f, g, pin, scores);
    }
  }
}

namespace detail {

// Rows scored at once: a tile of the MLP (kMlpTile), or for a linear correction a chunk of
// fill_policy_input (kPolicyInputChunk, twice as many: half the calls per row).
inline constexpr int kOpenRowsRun = kPolicyInputChunk;
static_assert(cpu_detail::kMlpTile <= kOpenRowsRun, "an MLP tile fits in a run");

// Copies of the features of scattered rows that the inputs and the score base read, for one
// run of rows (gather_open_rows), and the view of them that fill_policy_input takes.
struct OpenRowsTile {
  std::array<float, kOpenRowsRun> column[kNumFeatures];
  std::array<std::int32_t, kOpenRowsRun> position;
  std::array<float, kOpenRowsRun> last_query_mass, layer_last, accumulated_mass;
};

// Which of f's arrays the used inputs (and the score base) read.
struct OpenRowsNeeds {
  std::array<bool, kNumFeatures> column{};
  bool position = false, last_query_mass = false, layer_last = false, accumulated_mass = false;
};

inline OpenRowsNeeds open_rows_needs(std::span<const PolicyInput> inputs, std::span<const char> used, ScoreBase base) {
  OpenRowsNeeds n;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!used[i]) continue;
    switch (inputs[i]) {
      case PolicyInput::alpha: n.column[std::size_t(Feature::alpha)] = true; break;
      case PolicyInput::value_norm: n.column[std::size_t(Feature::value_norm)] = true; break;
      case PolicyInput::head_variance: n.column[std::size_t(Feature::head_variance)] = true; break;
      case PolicyInput::entropy: n.column[std::size_t(Feature::entropy)] = true; break;
      case PolicyInput::position: n.column[std::size_t(Feature::position)] = true; break;
      case PolicyInput::last_alpha: n.last_query_mass = true; break;
      case PolicyInput::budget_age:
      case PolicyInput::log_age: n.position = true; break;
      case PolicyInput::depth: break;
      case PolicyInput::layer_last_alpha: n.layer_last = true; break;
    }
  }
  n.accumulated_mass = base != ScoreBase::none;
  return n;
}

// Gathers rows[0, count) of f into t (only what `needs` names) and returns the view of them.
inline PolicyInputRows gather_open_rows(const TokenFeatures& f, const float* layer_last, const OpenRowsNeeds& needs,
                                        const std::int32_t* rows, int count, OpenRowsTile& t) {
  PolicyInputRows view;
  view.latest_position = f.latest_position;
  for (int c = 0; c < kNumFeatures; ++c) {
    if (!needs.column[std::size_t(c)]) continue;
    cpu_detail::gather(f.column(Feature(c)), rows, count, t.column[c].data());
    view.column[std::size_t(c)] = t.column[c].data();
  }
  if (needs.position) {
    cpu_detail::gather(f.position.data(), rows, count, t.position.data());
    view.position = t.position.data();
  }
  if (needs.last_query_mass) {
    cpu_detail::gather(f.last_query_mass.data(), rows, count, t.last_query_mass.data());
    view.last_query_mass = t.last_query_mass.data();
  }
  if (needs.layer_last) {
    cpu_detail::gather(layer_last, rows, count, t.layer_last.data());
    view.layer_last = t.layer_last.data();
  }
  if (needs.accumulated_mass) cpu_detail::gather(f.accumulated_mass.data(), rows, count, t.accumulated_mass.data());
  return view;
}

}  // namespace detail

// What mlp_score_open_rows needs beyond the rows, formed once per call: the checked arguments,
// layer_last_query_mass where an input reads it, and which inputs the first layer reads. Its
// methods score one group's open rows (mlp_score_open_rows, and policy/rules_then_mlp.hpp layer by
// layer).
class OpenRowScorer {
 public:
  // A thread's scratch.
  struct Scratch {
    std::vector<float> a, z;
    detail::OpenRowsTile gathered;
    std::vector<std::int32_t> open;
  };

  OpenRowScorer(const TokenFeatures& f, std::span<const PolicyInput> inputs, int budget, const MlpLayout& layout,
                const float* params, ScoreBase base)
      : f_(f), inputs_(inputs), budget_(budget), layout_(layout), params_(params), base_(base) {
    DC_CHECK(layout.inputs == int(inputs.size()), "mlp_policy_scores: the MLP takes ", layout.inputs,
             " inputs, ", inputs.size(), " asked for");
    layer_last_ = prepare_policy_inputs(f, inputs, budget);
    layers_ = policy_input_layers(f);
    // An input whose first-layer weights are all zero adds nothing (0 times a finite input): it
    // is not built. A linear correction (policy/linear_correction.hpp) typically reads a few of
    // its inputs, and the logarithms of the others were most of its scoring time.
    used_.assign(std::size_t(layout.inputs), 0);
    for (int o = 0; o < layout.out(0); ++o)
      for (int i = 0; i < layout.inputs; ++i)
        used_[std::size_t(i)] |= params[layout.weight_offset(0) + std::int64_t(o) * layout.inputs + i] != 0.0f;
    needs_ = detail::open_rows_needs(inputs, used_, base);
    linear_ = is_linear_correction(layout, std::span<const float>(params, std::size_t(layout.parameters())));
  }

  Scratch scratch() const {
    const std::size_t width = std::size_t(layout_.widest()) * cpu_detail::kMlpTile;
    return Scratch{std::vector<float>(width), std::vector<float>(width), {}, {}};
  }

  PolicyInputScale scale(int g) const { return policy_input_scale(f_, g, layers_); }

  // Rows scored per call of score_tile at most: a linear correction takes runs of kOpenRowsRun.
  int run_rows() const { return linear_ ? detail::kOpenRowsRun : cpu_detail::kMlpTile; }

  // Scores rows tile_rows[0, rows) (rows <= run_rows(), ascending, distinct, all of group g).
  void score_tile(const PolicyInputScale& scale, const std::int32_t* tile_rows, int rows, Scratch& t,
                  std::span<float> scores) const {
    const bool consecutive = tile_rows[rows - 1] - tile_rows[0] == rows - 1;
    const PolicyInputRows view =
        consecutive ? policy_input_rows(f_, layer_last_.empty() ? nullptr : layer_last_.data(), tile_rows[0])
                    : detail::gather_open_rows(f_, layer_last_.data(), needs_, tile_rows, rows, t.gathered);
    float tile_scores[detail::kOpenRowsRun];
    if (linear_)
      linear_scores(scale, view, rows, tile_scores);
    else
      network_scores(scale, view, rows, t, tile_scores);
    add_score_base(base_, consecutive ? f_.accumulated_mass.data() + tile_rows[0] : t.gathered.accumulated_mass.data(),
                   rows, tile_scores);
    for (int r = 0; r < rows; ++r) scores[std::size_t(tile_rows[r])] = tile_scores[r];
  }

  // Every open row of group g, on this thread.
  void score_group(int g, Scratch& t, std::span<float> scores) const {
    const FeatureGroup& group = f_.groups[std::size_t(g)];
    t.open.resize(std::size_t(group.rows()));
    const int open = cpu_detail::pack_rows_not_inf(scores.data() + group.row_begin, group.rows(), group.row_begin,
                                                   t.open.data());
    if (open == 0) return;
    const PolicyInputScale s = scale(g);
    const int run = run_rows();
    if (linear_ && 4 * std::int64_t(open) >= 3 * std::int64_t(group.rows())) {
      // Mostly open: every row scored where it lies, the forced rows' scores dropped. Three logs
      // a row cost a linear correction less than gathering each run's scattered rows did (v10,
      // B = 512 of 2048, every group about 5 rows in 6 open: 128-134 against 112-121 us in a
      // warm loop); a network's hundreds of operations a row do not pay for rows it drops.
      for (int first = group.row_begin; first < group.row_end; first += run)
        score_run_in_place(s, first, std::min(run, group.row_end - first), scores);
      return;
    }
    for (int first = 0; first < open; first += run)
      score_tile(s, t.open.data() + first, std::min(run, open - first), t, scores);
  }

 private:
  // A linear correction's scores of rows [first, first + rows) (rows <= kOpenRowsRun) into those
  // not +inf; +inf rows stay. Each row's score is the same bits as score_tile's: the loops are
  // elementwise.
  void score_run_in_place(const PolicyInputScale& scale, int first, int rows, std::span<float> scores) const {
    const PolicyInputRows view = policy_input_rows(f_, layer_last_.empty() ? nullptr : layer_last_.data(), first);
    float run_scores[detail::kOpenRowsRun];
    linear_scores(scale, view, rows, run_scores);
    add_score_base(base_, f_.accumulated_mass.data() + first, rows, run_scores);
    float* DC_RESTRICT out = scores.data() + first;
    for (int r = 0; r < rows; ++r) out[r] = out[r] != INFINITY ? run_scores[r] : out[r];
  }

  // The whole network on one tile (rows <= kMlpTile).
  void network_scores(const PolicyInputScale& scale, const PolicyInputRows& view, int rows, Scratch& t,
                      float* out) const {
    constexpr int T = cpu_detail::kMlpTile;
    for (int i = 0; i < layout_.inputs; ++i) {
      float* column = t.a.data() + std::size_t(i) * T;
      if (!used_[std::size_t(i)]) {
        std::fill(column, column + T, 0.0f);
        continue;
      }
      fill_policy_input(view, inputs_[std::size_t(i)], scale, budget_, rows, column);
      std::fill(column + rows, column + T, 0.0f);  // as mlp_tile_forward pads a short tile
    }
    cpu_detail::mlp_tile_layers(layout_, params_, 0, rows, out, nullptr, t.a.data(), t.z.data());
  }

  // A linear correction's network outputs its first unit's pre-activation, w . x
  // (policy/linear_correction.hpp): the unit's bias, then w_i x_i added input by input in the
  // order of the inputs, as mlp_tile_units does (a multiply-add per input), but only for the
  // inputs whose weight is nonzero. The same bits as the whole network: an input left out adds
  // 0 * 0 = +0 there, which changes no sum that starts from the bias +0 (it is never -0: +0 plus
  // -0 rounds to +0, and a sum of nonzero terms that cancels rounds to +0). Less work than the
  // network's first unit alone (no zero columns written and read, no copy of the unit's output)
  // and half the calls per row (runs of kOpenRowsRun rather than tiles of kMlpTile): at B = 512 of
  // 2048 (bench_eviction, v10) the linear scoring went from 85 to 70 us a thread.
  void linear_scores(const PolicyInputScale& scale, const PolicyInputRows& view, int rows,
                     float* DC_RESTRICT out) const {
    const float* w = params_ + layout_.weight_offset(0);
    const float bias = params_[layout_.bias_offset(0)];
    for (int r = 0; r < rows; ++r) out[r] = bias;
    float column[detail::kOpenRowsRun];
    for (int i = 0; i < layout_.inputs; ++i) {
      if (!used_[std::size_t(i)]) continue;
      fill_policy_input(view, inputs_[std::size_t(i)], scale, budget_, rows, column);
      const float wi = w[i];
      for (int r = 0; r < rows; ++r) out[r] += wi * column[r];
    }
  }

  const TokenFeatures& f_;
  std::span<const PolicyInput> inputs_;
  int budget_;
  const MlpLayout& layout_;
  const float* params_;
  ScoreBase base_;
  std::vector<float> layer_last_;
  int layers_ = 0;
  std::vector<char> used_;
  detail::OpenRowsNeeds needs_;
  bool linear_ = false;  // the network is a linear correction (is_linear_correction)
};

// The MLP's score (plus the base's) for every row whose score is not +inf, outside the groups
// flagged in `unscored` (empty, or a flag per group); +inf rows and flagged groups are left as
// they are. The caller's rules (mark_forced_rows, then MlpPolicy's reserves) have already kept
// the +inf rows, so the MLP would score them for nothing: at half of the budget the recent window
// and the reserves keep more than three rows in four (SmolLM2, B = 2048 of 4096), and the MLP
// scores only the rest.
//
// The open rows of each group are packed (in row order) and scored a tile of 32 at a time (a
// linear correction: a run of 64, OpenRowScorer::run_rows); a tile of consecutive rows reads f's columns where they are, any other has its rows' features
// gathered first. Each row's arithmetic is the same either way (the loops are elementwise), so
// a row's score does not depend on which other rows are open. Tiles are numbered across groups
// so that even one shared group spreads over every thread.
inline void mlp_score_open_rows(const TokenFeatures& f, std::span<const PolicyInput> inputs, int budget,
                                const MlpLayout& layout, const float* params, std::span<float> scores,
                                ScoreBase base = ScoreBase::none, std::span<const char> unscored = {}) {
  DC_CHECK(scores.size() >= std::size_t(f.size), "mlp_policy_scores: ", scores.size(),
           " scores for ", f.size, " rows");
  DC_CHECK(unscored.empty() || unscored.size() == f.groups.size(), "mlp_policy_scores: ", unscored.size(),
           " group flags for ", f.groups.size(), " groups");
  const OpenRowScorer mlp(f, inputs, budget, layout, params, base);
  const int T = mlp.run_rows();
  const int groups = f.num_groups();
  std::vector<PolicyInputScale> scale(static_cast<std::size_t>(groups));
  // open[row_begin, row_begin + open_rows[g]): group g's open rows, packed.
  const auto open = std::make_unique_for_overwrite<std::int32_t[]>(std::size_t(f.size));  // no zeroing: all written
  std::vector<int> open_rows(std::size_t(groups), 0);
  DC_OMP(parallel for schedule(dynamic) if (groups > 1 && f.size > 4096))
  for (int g = 0; g < groups; ++g) {
    scale[std::size_t(g)] = mlp.scale(g);
    if (!unscored.empty() && unscored[std::size_t(g)]) continue;
    const FeatureGroup& group = f.groups[std::size_t(g)];
    open_rows[std::size_t(g)] = cpu_detail::pack_rows_not_inf(scores.data() + group.row_begin, group.rows(),
                                                              group.row_begin, open.get() + group.row_begin);
  }
  // first_tile[g]: the index of group g's first tile, tiles numbered group after group.
  std::vector<std::int64_t> first_tile(std::size_t(groups) + 1, 0);
  for (int g = 0; g < groups; ++g)
    first_tile[std::size_t(g) + 1] = first_tile[std::size_t(g)] + (open_rows[std::size_t(g)] + T - 1) / T;
  const std::int64_t count = first_tile.back();
  if (count == 0) return;
  DC_OMP(parallel if (count > 64))
  {
    OpenRowScorer::Scratch scratch = mlp.scratch();
    DC_OMP(for schedule(static))
    for (std::int64_t t = 0; t < count; ++t) {
      const int g = int(std::upper_bound(first_tile.begin(), first_tile.end(), t) - first_tile.begin()) - 1;
      const int first = int(t - first_tile[std::size_t(g)]) * T;
      mlp.score_tile(scale[std::size_t(g)], open.get() + f.groups[std::size_t(g)].row_begin + first,
                     std::min(T, open_rows[std::size_t(g)] - first), scratch, scores);
    }
  }
}

// Every row's score: the MLP's (plus the base's), +inf for rows in the recent window or pinned
// (mark_forced_rows), 0 for the rows of groups flagged in `unscored`.
inline void mlp_policy_scores(const TokenFeatures& f, std::span<const PolicyInput> inputs, int budget,
                              const MlpLayout& layout, const float* params, std::span<float> scores,
                              int recent = 0, ScoreBase base = ScoreBase::none,
                              std::span<const char> pinned = {}, std::span<const char> unscored = {}) {
  DC_CHECK(layout.inputs == int(inputs.size()), "mlp_policy_scores: the MLP takes ", layout.inputs,
           " inputs, ", inputs.size(), " asked for");
  DC_CHECK(scores.size() >= std::size_t(f.size), "mlp_policy_scores: ", scores.size(),
           " scores for ", f.size, " rows");
  DC_CHECK(recent >= 0, "mlp_policy_scores: negative recent window ", recent);
  mark_forced_rows(f, recent, pinned, unscored, scores);
  mlp_score_open_rows(f, inputs, budget, layout, params, scores, base, unscored);
}

}  // namespace dc
