#pragma once
// The learned policy's input matrix: a chosen list of scale-free inputs per row
// (math/policy_inputs.hpp has the formulas and why they are scale-free).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../cache/features.hpp"
#include "../core/config.hpp"
#include "../math/policy_inputs.hpp"

#if defined(__AVX__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace dc {

// The paper's five features, then optional ones: the newest query's mass (a second observation
// window: the newest query alone, TOVA's signal), the token's age in units of the budget
// (what a recency window of H2O's kind is measured in) and its age in tokens (what attention's
// locality is measured in), the depth of the group's layer (what the cost of evicting differs
// by), and the newest query's mass averaged over every KV head of the row's layer (TOVA's own
// signal: per-layer keep-sets by it keep needles that per-head ones lose, so a head-granular
// policy needs it as an input to do the same).
enum class PolicyInput : int {
  alpha = 0, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth, layer_last_alpha
};
inline constexpr int kNumPolicyInputs = 10;
inline constexpr const char* kPolicyNormalisation = "scale_free_v1";

inline const char* policy_input_name(PolicyInput i) {
  constexpr std::array<const char*, kNumPolicyInputs> names = {
      "alpha",      "value_norm", "head_variance", "entropy", "position",
      "last_alpha", "budget_age", "log_age",       "depth",   "layer_last_alpha"};
  return names[std::size_t(i)];
}

inline PolicyInput parse_policy_input(std::string_view name) {
  for (int i = 0; i < kNumPolicyInputs; ++i)
    if (name == policy_input_name(PolicyInput(i))) return PolicyInput(i);
  DC_FAIL("unknown policy input '", std::string(name),
          "' (known: alpha, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth, "
          "layer_last_alpha)");
}

inline std::vector<PolicyInput> paper_policy_inputs() {
  return {PolicyInput::alpha, PolicyInput::value_norm, PolicyInput::head_variance,
          PolicyInput::entropy, PolicyInput::position};
}

// Whether every layer a group covers is in `layers` (empty: every group). A shared group covers
// every layer, so a list of some layers leaves it out.
inline bool group_in_layers(const FeatureGroup& group, std::span<const int> layers) {
  if (layers.empty()) return true;
  for (int l = group.layer_begin; l < group.layer_end; ++l)
    if (!std::binary_search(layers.begin(), layers.end(), l)) return false;
  return true;
}

// The groups of f inside `layers` (sorted; group_in_layers), gathered by the layer range they
// cover (at head granularity a layer's KV heads, one group each), with the KV heads the range
// has in all. `groups` views the LayerRanges that holds the range.
struct LayerRangeGroups {
  int layer_begin = 0, layer_end = 0;
  int heads = 0;
  std::span<const int> groups;
};

class LayerRanges;
inline LayerRanges layer_range_groups(const TokenFeatures& f, std::span<const int> layers);

// Every range of layer_range_groups, in the order of their first group, and the group indices
// their views read, range after range: two vectors for the whole set, where one vector per
// range (about a hundred small allocations on SmolLM2, with their growth) took 10-15 us of an
// eviction at B = 512 of 2048, where the compaction before it has left the allocator's memory
// cold (3 us in a warm loop). Move-only, so that no copy's views point into another object
// (a move keeps the vectors' buffers, and with them the views).
class LayerRanges {
 public:
  LayerRanges() = default;
  LayerRanges(LayerRanges&&) = default;
  LayerRanges& operator=(LayerRanges&&) = default;
  LayerRanges(const LayerRanges&) = delete;
  LayerRanges& operator=(const LayerRanges&) = delete;

  std::size_t size() const { return ranges_.size(); }
  bool empty() const { return ranges_.empty(); }
  const LayerRangeGroups& operator[](std::size_t r) const { return ranges_[r]; }
  const LayerRangeGroups* begin() const { return ranges_.data(); }
  const LayerRangeGroups* end() const { return ranges_.data() + ranges_.size(); }
  const LayerRangeGroups* data() const { return ranges_.data(); }

 private:
  friend LayerRanges layer_range_groups(const TokenFeatures& f, std::span<const int> layers);
  std::vector<int> group_order_;
  std::vector<LayerRangeGroups> ranges_;
};

inline LayerRanges layer_range_groups(const TokenFeatures& f, std::span<const int> layers) {
  const int groups = f.num_groups();
  LayerRanges out;
  out.ranges_.reserve(std::size_t(groups));
  // Each group's range (-1: outside `layers`), found by a look at the previous group's range
  // first: gather_features writes a range's groups one after the other.
  std::vector<int> range_of(std::size_t(groups), -1), count;
  count.reserve(std::size_t(groups));
  auto is_range = [&](int index, const FeatureGroup& grp) {
    const LayerRangeGroups& range = out.ranges_[std::size_t(index)];
    return range.layer_begin == grp.layer_begin && range.layer_end == grp.layer_end;
  };
  int r = -1;
  for (int g = 0; g < groups; ++g) {
    const FeatureGroup& grp = f.groups[std::size_t(g)];
    if (!group_in_layers(grp, layers)) continue;
    if (r < 0 || !is_range(r, grp)) {
      r = 0;
      while (r < int(out.ranges_.size()) && !is_range(r, grp)) ++r;
      if (r == int(out.ranges_.size())) {
        out.ranges_.push_back(LayerRangeGroups{grp.layer_begin, grp.layer_end, 0, {}});
        count.push_back(0);
      }
    }
    range_of[std::size_t(g)] = r;
    ++count[std::size_t(r)];
    out.ranges_[std::size_t(r)].heads += grp.head_end - grp.head_begin;
  }
  // Counting sort of the groups by range (group order kept within a range), then the views.
  std::vector<int> next(out.ranges_.size());
  int placed = 0;
  for (std::size_t i = 0; i < next.size(); ++i) {
    next[i] = placed;
    placed += count[i];
  }
  out.group_order_.resize(std::size_t(placed));
  for (int g = 0; g < groups; ++g)
    if (range_of[std::size_t(g)] >= 0) out.group_order_[std::size_t(next[std::size_t(range_of[std::size_t(g)])]++)] = g;
  placed = 0;
  for (std::size_t i = 0; i < out.ranges_.size(); ++i) {
    out.ranges_[i].groups = std::span<const int>(out.group_order_.data() + placed, std::size_t(count[i]));
    placed += count[i];
  }
  return out;
}

// By position in [0, latest_position]: the newest observed query's mass averaged over every KV
// head of `range` (a head that evicted the position counts 0), into `mean` (resized). The one
// formula behind layer_last_query_mass and the newest-query reserve, so both give the same bits.
// Rows are matched by position, so each must index [0, latest]: false (and `mean` unfinished)
// where one does not. It returns a flag rather than throwing because callers run it inside a
// parallel region; they then name the row with check_layer_range_positions.
[[nodiscard]] inline bool layer_mean_newest_query_mass(const TokenFeatures& f, const LayerRangeGroups& range,
                                                       std::vector<float>& mean) {
  mean.assign(std::size_t(f.latest_position) + 1, 0.0f);
  const std::uint32_t positions = std::uint32_t(mean.size());
  float* DC_RESTRICT sum = mean.data();
  const std::int32_t* DC_RESTRICT position = f.position.data();
  const float* DC_RESTRICT last_query_mass = f.last_query_mass.data();
  for (int g : range.groups) {
    const FeatureGroup& grp = f.groups[std::size_t(g)];
    const float weight = float(grp.head_end - grp.head_begin);  // last_query_mass is a mean over them
    for (int row = grp.row_begin; row < grp.row_end; ++row) {
      const std::uint32_t p = std::uint32_t(position[row]);
      if (p >= positions) return false;
      sum[p] += weight * last_query_mass[row];
    }
  }
  const float heads = float(range.heads > 0 ? range.heads : 1);
  for (float& m : mean) m /= heads;
  return true;
}

// Throws naming the first row of `ranges` whose position lies outside [0, latest_position].
inline void check_layer_range_positions(const TokenFeatures& f, std::span<const LayerRangeGroups> ranges) {
  for (const LayerRangeGroups& range : ranges)
    for (int g : range.groups)
      for (int r = f.groups[std::size_t(g)].row_begin; r < f.groups[std::size_t(g)].row_end; ++r)
        DC_CHECK(f.position[std::size_t(r)] >= 0 && f.position[std::size_t(r)] <= f.latest_position,
                 "layer_last_alpha: row ", r, " has position ", f.position[std::size_t(r)], " outside [0, ",
                 f.latest_position, "]");
}

// Per row: the newest observed query's mass at the row's position, averaged over every KV head of
// the layers its group covers (layer_mean_newest_query_mass). At shared and layer granularity a
// group already covers whole layers, so this is last_query_mass; at head granularity the heads
// of a layer hold different positions (per-head keep-sets), so rows are matched by position, not
// slot. With `layers` (sorted; group_in_layers) only the groups inside those layers are computed
// and the other rows are 0: a rule that reads three layers of thirty does not pay for thirty.
inline std::vector<float> layer_last_query_mass(const TokenFeatures& f, std::span<const int> layers = {}) {
  std::vector<float> out(std::size_t(f.size), 0.0f);
  const LayerRanges ranges = layer_range_groups(f, layers);
  const int num_ranges = int(ranges.size());
  int bad = 0;
  DC_OMP(parallel for schedule(dynamic) reduction(| : bad) if (num_ranges > 1 && f.size > 4096))
  for (int r = 0; r < num_ranges; ++r) {
    std::vector<float> mean;
    if (!layer_mean_newest_query_mass(f, ranges[std::size_t(r)], mean)) {
      bad |= 1;
      continue;
    }
    for (int g : ranges[std::size_t(r)].groups)
      for (int row = f.groups[std::size_t(g)].row_begin; row < f.groups[std::size_t(g)].row_end; ++row)
        out[std::size_t(row)] = mean[std::size_t(f.position[std::size_t(row)])];
  }
  if (bad) check_layer_range_positions(f, ranges);
  return out;
}

// What the inputs of one group's rows are taken relative to (math/policy_inputs.hpp): its row
// count, its mean value norm, log(row count) for the entropy, its depth.
struct PolicyInputScale {
  int rows = 0;
  float mean_value_norm = 0.0f;
  float entropy_scale = 0.0f;
  float depth = 0.0f;
};

inline PolicyInputScale policy_input_scale(const TokenFeatures& f, int group, int layers) {
  const FeatureGroup& g = f.groups[std::size_t(group)];
  PolicyInputScale s;
  s.rows = g.rows();
  double norm_sum = 0.0;  // an empty group has none
  if (f.group_value_norm_sum.size() == f.groups.size())
    norm_sum = f.group_value_norm_sum[std::size_t(group)];  // gather_features summed it
  else if (s.rows > 0)
    norm_sum = value_norm_sum(f.column(Feature::value_norm) + g.row_begin, s.rows);
  s.mean_value_norm = s.rows > 0 ? float(norm_sum / s.rows) : 0.0f;
  s.entropy_scale = math::input_entropy_scale(s.rows);
  s.depth = math::input_depth(g.layer_begin, g.layer_end, layers);
  return s;
}

// The layers the groups of f span (depth's scale).
inline int policy_input_layers(const TokenFeatures& f) {
  int layers = 0;
  for (const FeatureGroup& g : f.groups) layers = std::max(layers, g.layer_end);
  return layers;
}

namespace detail {

// out[i] = sqrt(max(v[i], 0)) (NaN reads as 0), correctly rounded like sqrtf. With vector
// instructions where the build has them: a loop calling sqrtf stays scalar (GCC 12 keeps a
// call for errno beside each square root), and head_variance's square root was then the policy
// inputs' slowest loop.
inline void sqrt_clamped(const float* DC_RESTRICT v, int count, float* DC_RESTRICT out) {
  int i = 0;
#if defined(__AVX__) && !defined(__CUDACC__)
  // 8 lanes even under AVX-512: GCC 12's 16-lane sqrt and max intrinsics trip its own
  // -Wmaybe-uninitialized (they pass _mm512_undefined_ps as the masked-off source).
  for (; i + 8 <= count; i += 8)  // max_ps gives its second operand (0) for a NaN first
    _mm256_storeu_ps(out + i, _mm256_sqrt_ps(_mm256_max_ps(_mm256_loadu_ps(v + i), _mm256_setzero_ps())));
#endif
  for (; i < count; ++i) out[i] = std::sqrt(v[i] > 0.0f ? v[i] : 0.0f);
}

}  // namespace detail

// Rows per call of fill_policy_input at most (a tile of the MLP is 32).
inline constexpr int kPolicyInputChunk = 64;

// The raw features of a run of rows that fill_policy_input reads, row i of the run at index i of
// each array: f's own arrays at the run's first row (policy_input_rows), or copies of scattered
// rows gathered into a tile (policy/mlp_scoring.hpp scores only the rows its rules left open).
// Arrays an input does not read may be null.
struct PolicyInputRows {
  std::array<const float*, kNumFeatures> column{};
  const std::int32_t* position = nullptr;
  const float* last_query_mass = nullptr;
  const float* layer_last = nullptr;  // layer_last_query_mass (layer_last_alpha reads it)
  int latest_position = 0;
};

// The rows of f from row0 on; layer_last: layer_last_query_mass(f), or null when unread.
inline PolicyInputRows policy_input_rows(const TokenFeatures& f, const float* layer_last, int row0) {
  PolicyInputRows rows;
  for (int c = 0; c < kNumFeatures; ++c) rows.column[std::size_t(c)] = f.column(Feature(c)) + row0;
  // (an empty vector's data() may be null, and null plus an offset is undefined)
  rows.position = f.position.empty() ? nullptr : f.position.data() + row0;
  rows.last_query_mass = f.last_query_mass.empty() ? nullptr : f.last_query_mass.data() + row0;
  rows.layer_last = layer_last ? layer_last + row0 : nullptr;
  rows.latest_position = f.latest_position;
  return rows;
}

// Input `in` of the first `count` rows of `rows` (count <= kPolicyInputChunk), all of one group
// scaled by s, into out[0, count). One loop per input with the choice outside it, so each loop
// vectorises (math::log_poly) over a feature's contiguous column. budget: the rows each group
// keeps (budget_age reads it).
inline void fill_policy_input(const PolicyInputRows& rows, PolicyInput in, const PolicyInputScale& s, int budget,
                              int count, float* DC_RESTRICT out) {
  DC_CHECK(count >= 0 && count <= kPolicyInputChunk, "fill_policy_input: ", count, " rows in one call");
  // The group's scales as locals: read through `s` inside a loop, GCC left value_norm's loop
  // scalar once its feature column was no longer a local array.
  const int n = s.rows, latest = rows.latest_position;
  const float mean_value_norm = s.mean_value_norm, entropy_scale = s.entropy_scale;
  auto column = [&](Feature c) { return rows.column[std::size_t(c)]; };
  const std::int32_t* DC_RESTRICT pos = rows.position;
  switch (in) {
    case PolicyInput::alpha: {
      const float* DC_RESTRICT c = column(Feature::alpha);
      for (int i = 0; i < count; ++i) out[i] = math::input_log_relative_mass(c[i], n);
      return;
    }
    case PolicyInput::value_norm: {
      const float* DC_RESTRICT c = column(Feature::value_norm);
      for (int i = 0; i < count; ++i) out[i] = math::input_log_relative_norm(c[i], mean_value_norm);
      return;
    }
    case PolicyInput::head_variance: {
      float spread[kPolicyInputChunk];
      detail::sqrt_clamped(column(Feature::head_variance), count, spread);  // the standard deviation across heads
      for (int i = 0; i < count; ++i) out[i] = math::input_log_relative_std(spread[i], n);
      return;
    }
    case PolicyInput::entropy: {
      const float* DC_RESTRICT c = column(Feature::entropy);
      for (int i = 0; i < count; ++i) out[i] = math::input_relative_entropy_scaled(c[i], entropy_scale);
      return;
    }
    case PolicyInput::position:
      std::copy_n(column(Feature::position), count, out);
      return;
    case PolicyInput::last_alpha: {
      const float* DC_RESTRICT last = rows.last_query_mass;
      for (int i = 0; i < count; ++i) out[i] = math::input_log_relative_mass(last[i], n);
      return;
    }
    case PolicyInput::budget_age:
      for (int i = 0; i < count; ++i) out[i] = math::input_log_budget_age(latest - pos[i], budget);
      return;
    case PolicyInput::log_age:
      for (int i = 0; i < count; ++i) out[i] = math::input_log_age(latest - pos[i]);
      return;
    case PolicyInput::depth:
      for (int i = 0; i < count; ++i) out[i] = s.depth;
      return;
    case PolicyInput::layer_last_alpha: {
      const float* DC_RESTRICT layer_last = rows.layer_last;
      for (int i = 0; i < count; ++i) out[i] = math::input_log_relative_mass(layer_last[i], n);
      return;
    }
  }
}

// The same for rows [row0, row0 + count) of f; layer_last: layer_last_query_mass(f) when `in` is
// layer_last_alpha (else unread).
inline void fill_policy_input(const TokenFeatures& f, PolicyInput in, const PolicyInputScale& s,
                              const float* layer_last, int budget, int row0, int count, float* DC_RESTRICT out) {
  fill_policy_input(policy_input_rows(f, layer_last, row0), in, s, budget, count, out);
}

// Checks what every way of building the inputs needs; returns layer_last_query_mass(f) when the
// inputs ask for it (empty otherwise).
inline std::vector<float> prepare_policy_inputs(const TokenFeatures& f, std::span<const PolicyInput> inputs,
                                                int budget) {
  DC_CHECK(!inputs.empty(), "policy_inputs: no inputs asked for");
  DC_CHECK(budget >= 1 || std::find(inputs.begin(), inputs.end(), PolicyInput::budget_age) == inputs.end(),
           "policy_inputs: budget_age needs a budget of at least 1 row, got ", budget);
  const bool wants_layer_last =
      std::find(inputs.begin(), inputs.end(), PolicyInput::layer_last_alpha) != inputs.end();
  return wants_layer_last ? layer_last_query_mass(f) : std::vector<float>();
}

// [f.size, inputs.size()] row-major: the inputs of every row, in the order asked for; budget is
// the number of rows each group keeps (only budget_age reads it). The trainer's form (it keeps
// the inputs for the backward); inference builds them tile by tile (policy/mlp_scoring.hpp).
inline std::vector<float> policy_inputs(const TokenFeatures& f, std::span<const PolicyInput> inputs,
                                        int budget) {
  const std::vector<float> layer_last = prepare_policy_inputs(f, inputs, budget);
  const std::size_t k = inputs.size();
  std::vector<float> out(std::size_t(f.size) * k);
  // Groups are independent (each its own rows and means): in parallel, since the logarithms of
  // 737k rows (SmolLM2 at 8k, head granularity) took longer than the MLP that reads them.
  const int groups = f.num_groups();
  const int layers = policy_input_layers(f);
  constexpr int kChunk = kPolicyInputChunk;  // rows per column pass
  DC_OMP(parallel for schedule(dynamic) if (groups > 1 && f.size > 4096))
  for (int group = 0; group < groups; ++group) {
    const FeatureGroup& g = f.groups[std::size_t(group)];
    const PolicyInputScale s = policy_input_scale(f, group, layers);
    float column[kChunk];
    for (int row0 = g.row_begin; row0 < g.row_end; row0 += kChunk) {
      const int count = std::min(kChunk, g.row_end - row0);
      for (std::size_t j = 0; j < k; ++j) {
        fill_policy_input(f, inputs[j], s, layer_last.data(), budget, row0, count, column);
        for (int i = 0; i < count; ++i) out[(std::size_t(row0) + std::size_t(i)) * k + j] = column[i];
      }
    }
  }
  return out;
}

}  // namespace dc
