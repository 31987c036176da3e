#pragma once
// TokenFeatures: what an eviction policy sees — one *row* per candidate for eviction, each in a
// *group* whose keep-set is the top-B of its rows.
//
// Granularity decides what a row is:
//   shared  one row per slot; one group: a single keep-set for every layer and KV head
//   layer   one row per (layer, slot); one group per layer (its KV heads share the set)
//   head    one row per (layer, KV head, slot); one group per (layer, KV head)
// A group's rows are contiguous and in slot order, which is position order (compaction keeps
// the order, appends come last), so a policy may look at a row's neighbours (SnapKV's pooling).
//
// The five DistillCache features of a row (math/features.hpp has the formulas) are sums of the
// per-(KV head, slot) statistics over the layers and KV heads the row's group covers:
//   alpha          attention mass received per (query head x observed query) of the group
//   value_norm     ||v||_2, mean over the covered layers and KV heads
//   head_variance  variance across the covered query heads of their mean mass received
//   entropy        attention-weighted entropy of the queries attending to the token
//   position       position / latest position
// At head granularity these are kvpress's per-(layer, KV head) quantities: the mass is the
// mean over the KV group's query heads, as its presses average attention over a group.
//
// Only the cache's evictable layers have rows or enter the sums (KVCache::evictable): on a model
// with local sliding-window layers (Gemma 3) those keep their window by themselves
// (KVCache::trim_to_windows) and their statistics, which cover the window alone, would bias
// the global layers' view. A group's [layer_begin, layer_end) is a range of which it covers
// the evictable layers.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/copy.hpp"
#include "../core/finite.hpp"
#include "../cpu/parallel.hpp"
#include "../math/features.hpp"
#include "expected_attention.hpp"
#include "kv_cache.hpp"

namespace dc {

enum class Granularity { shared, layer, head };

inline const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::shared: return "shared";
    case Granularity::layer: return "layer";
    case Granularity::head: return "head";
  }
  return "?";
}

inline Granularity parse_granularity(std::string_view name) {
  if (name == "shared") return Granularity::shared;
  if (name == "layer") return Granularity::layer;
  if (name == "head") return Granularity::head;
  DC_FAIL("unknown granularity '", std::string(name), "' (known: shared, layer, head)");
}

// Column of a row in TokenFeatures::x: the learned policy's inputs, in this order.
enum class Feature : int { alpha = 0, value_norm, head_variance, entropy, position };
inline constexpr int kNumFeatures = 5;

inline const char* feature_name(Feature f) {
  constexpr std::array<const char*, kNumFeatures> names = {"alpha", "value_norm", "head_variance",
                                                           "entropy", "position"};
  return names[std::size_t(f)];
}

// The layers (the evictable ones in the range) and KV heads a group covers, and its rows
// [row_begin, row_end).
struct FeatureGroup {
  int layer_begin = 0, layer_end = 0;
  int head_begin = 0, head_end = 0;
  int row_begin = 0, row_end = 0;
  int rows() const { return row_end - row_begin; }
  bool covers(int layer, int head) const {
    return layer >= layer_begin && layer < layer_end && head >= head_begin && head < head_end;
  }
};

struct TokenFeatures {
  Granularity granularity = Granularity::shared;
  int size = 0;             // rows
  int latest_position = 0;  // position of the newest token
  int num_layers = 0;       // the model's layers, evictable or not (0 when built by hand: see model_layers())
  std::vector<FeatureGroup> groups;
  // Per row.
  std::vector<std::int32_t> group;     // index into groups
  std::vector<std::int32_t> slot;      // cache slot within the group's heads
  std::vector<std::int32_t> position;  // original token position
  // The policy's features, one column of `size` floats per dc::Feature (column-major: a policy
  // reads one feature over a run of rows, contiguous; a [rows, 5] matrix made every such read a
  // stride-5 gather, which was the largest part of building the learned policy's inputs).
  std::array<std::vector<float>, kNumFeatures> columns;
  // Raw statistics the baselines use.
  std::vector<float> accumulated_mass;  // sum over covered layers, heads and observed queries (H2O)
  std::vector<float> last_query_mass;   // newest observed query's mass, mean over covered heads/layers (TOVA)
  std::vector<float> key_norm;          // ||k||_2, mean over covered layers and KV heads (KNorm)
  // Expected attention of future queries (cache/expected_attention.hpp), mean over covered layers
  // and KV heads; only when the cache collected query statistics (zeros otherwise).
  bool has_expected_attention = false;
  std::vector<float> expected_attention;
  // Per group: the sum of its rows' value_norm column (value_norm_sum's order), which the
  // learned policy's inputs are relative to. gather_features fills it while the column is hot;
  // empty for features built by hand, and then a policy sums the column itself (same bits).
  std::vector<double> group_value_norm_sum;

  int num_groups() const { return int(groups.size()); }
  // The model's layer count: num_layers, or where it is 0 the layers the groups reach.
  int model_layers() const {
    int layers = num_layers;
    for (const FeatureGroup& g : groups) layers = std::max(layers, g.layer_end);
    return layers;
  }
  float feature(int row, Feature f) const { return columns[std::size_t(f)][std::size_t(row)]; }
  const float* column(Feature f) const { return columns[std::size_t(f)].data(); }
  float* column(Feature f) { return columns[std::size_t(f)].data(); }
  // Appends one row's features, in Feature order (for features built by hand; the other
  // per-row vectors are the caller's to extend, and `size` to raise).
  void append_features(std::span<const float, kNumFeatures> row) {
    for (int c = 0; c < kNumFeatures; ++c) columns[std::size_t(c)].push_back(row[std::size_t(c)]);
  }
  void append_features(float all) {
    for (auto& c : columns) c.push_back(all);
  }

  // Throws dc::Error naming the first problem: a column whose length is not `size`, groups that
  // do not tile the rows, or a non-finite value (which would make any policy's keep-set
  // arbitrary). The decoder checks every gathered set before a policy sees it; call it on
  // features built by hand.
  void validate() const {
    DC_CHECK(size >= 0, "features: negative size ", size);
    const std::pair<const char*, std::size_t> per_row[] = {
        {"group", group.size()},
        {"slot", slot.size()},
        {"position", position.size()},
        {"accumulated_mass", accumulated_mass.size()},
        {"last_query_mass", last_query_mass.size()},
        {"key_norm", key_norm.size()},
        {"expected_attention", expected_attention.size()}};
    for (const auto& [name, n] : per_row)
      DC_CHECK(n == std::size_t(size), "features: '", name, "' has ", n, " entries for ", size,
               " rows");
    for (int c = 0; c < kNumFeatures; ++c)
      DC_CHECK(columns[std::size_t(c)].size() == std::size_t(size), "features: '", feature_name(Feature(c)), "' has ",
               columns[std::size_t(c)].size(), " entries for ", size, " rows");
    int next = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      DC_CHECK(groups[g].row_begin == next && groups[g].row_end >= next && groups[g].row_end <= size,
               "features: group ", g, " covers rows [", groups[g].row_begin, ", ", groups[g].row_end,
               "), expected to start at ", next, " and end by ", size);
      next = groups[g].row_end;
      DC_CHECK(num_layers == 0 || groups[g].layer_end <= num_layers, "features: group ", g, " reaches layer ",
               groups[g].layer_end - 1, " of a model of ", num_layers, " layers");
    }
    DC_CHECK(next == size, "features: groups cover ", next, " of ", size, " rows");
    DC_CHECK(group_value_norm_sum.empty() || group_value_norm_sum.size() == groups.size(),
             "features: ", group_value_norm_sum.size(), " value norm sums for ", groups.size(), " groups");
    // Every row's group and every float column (the features, then the raw statistics) are
    // checked in one parallel pass: every eviction checks its features (737k rows x 9 columns on
    // SmolLM2 at 8k, head granularity), and one thread doing it left the other waiting. Only
    // when something is wrong do the serial loops below look for the first bad entry to name.
    // In parallel from two chunks on: at 47k rows (B = 512 of 2048, 25 % of SmolLM2's 2k) the
    // features come cold from the last-level cache after the previous compaction, and one thread
    // took 90-100 us where two take 55 (H2O's whole eviction there takes about 1400).
    // Each thread checks the groups of its contiguous share of the rows (cpu_detail::
    // contiguous_share), the rows the gather wrote on it and the policy then scores on it.
    const std::vector<float>* floats[] = {&columns[0], &columns[1], &columns[2], &columns[3], &columns[4],
                                          &accumulated_mass, &last_query_mass, &key_norm, &expected_attention};
    static_assert(kNumFeatures == 5, "floats[] lists every feature column");
    constexpr int kCheckRows = 8192;
    const int num_groups = int(groups.size());
    int bad = 0;
    DC_OMP(parallel reduction(| : bad) if (size > 2 * kCheckRows))
    {
      const int thread = cpu_detail::thread_num(), threads = cpu_detail::num_threads();
      for (int g = 0; g < num_groups; ++g) {
        const FeatureGroup& grp = groups[std::size_t(g)];
        if (cpu_detail::contiguous_share(grp.row_begin, grp.row_end, size, threads) != thread) continue;
        for (int r = grp.row_begin; r < grp.row_end; ++r) bad |= group[std::size_t(r)] != g ? 1 : 0;
      }
      // The float columns by rows (one shared group still splits): thread t's t-th of them.
      const std::size_t begin = std::size_t(std::int64_t(size) * thread / threads);
      const std::size_t end = std::size_t(std::int64_t(size) * (thread + 1) / threads);
      for (std::size_t row = begin; row < end; row += kCheckRows) {
        const std::size_t count = std::min<std::size_t>(kCheckRows, end - row);
        for (const std::vector<float>* column : floats)
          bad |= all_finite(std::span<const float>(column->data() + row, count)) ? 0 : 2;
      }
    }
    if (bad == 0) return;
    for (int g = 0; g < num_groups; ++g)
      for (int r = groups[std::size_t(g)].row_begin; r < groups[std::size_t(g)].row_end; ++r)
        DC_CHECK(group[std::size_t(r)] == g, "features: row ", r, " has group ", group[std::size_t(r)],
                 ", lies in group ", g);
    for (int c = 0; c < kNumFeatures; ++c)
      for (int r = 0; r < size; ++r)
        if (!std::isfinite(feature(r, Feature(c))))
          DC_FAIL("features: '", feature_name(Feature(c)), "' of row ", r, " is ",
                  describe_non_finite(feature(r, Feature(c))));
    check_all_finite(accumulated_mass, "features: 'accumulated_mass'");
    check_all_finite(last_query_mass, "features: 'last_query_mass'");
    check_all_finite(key_norm, "features: 'key_norm'");
    check_all_finite(expected_attention, "features: 'expected_attention'");
  }
};

// The sum of `count` floats, in double, in eight running sums (element 8k + lane; the last
// count % 8 elements into lane 0), added up lane by lane at the end: one chain of dependent
// double additions over a group's rows took longer than all the policy's logarithms.
inline double value_norm_sum(const float* values, int count) {
  constexpr int kLanes = 8;
  double lane_sum[kLanes] = {};
  int r = 0;
  for (; r + kLanes <= count; r += kLanes)
    for (int k = 0; k < kLanes; ++k) lane_sum[k] += values[r + k];
  for (; r < count; ++r) lane_sum[0] += values[r];
  double sum = 0.0;
  for (double v : lane_sum) sum += v;
  return sum;
}

namespace detail {

// One layer's statistics as the gather reads them: [kv_heads, rows, stride] floats on the host
// (the cache's own block on the CPU, stride = capacity; a host copy of the valid slots from a
// GPU, stride = length).
struct HostStatistics {
  const float* data = nullptr;
  std::int64_t stride = 0;
};

// Writes the rows of group g, which covers the evictable layers of [l0, l1) and KV heads
// [h0, h1) (all holding the same slots, at the given positions) and starts at row0 of f, whose
// columns are already sized. expected[l] is layer l's expected attention [kv_heads, n] (empty
// without query statistics). Touches only the group's rows, so groups may run in parallel.
//
// Column by column: each statistics row is added into a per-group column with the slots
// innermost (contiguous, vectorised), then the features are formed row by row from those sums.
// Every row's sums take the same terms in the same order as a loop over (layer, head) per row
// would, so the features are the same bits; the per-row loop it replaced read nine statistics
// rows with a stride of the cache's capacity for every slot and was a seventh of a decode-time
// eviction.
inline void write_group_rows(TokenFeatures& f, int g, int row0,
                             const std::vector<HostStatistics>& stats,
                             const std::vector<std::vector<float>>& expected,
                             const std::vector<bool>& evictable,
                             const std::vector<std::int32_t>& positions, int l0, int l1, int h0,
                             int h1, int group_size) {
  const int n = int(positions.size()), rows_per_head = stat_rows_per_kv_head(group_size);
  int layers = 0;
  for (int l = l0; l < l1; ++l) layers += evictable[std::size_t(l)] ? 1 : 0;
  const float covered = float(layers * (h1 - h0));
  const int query_heads = (h1 - h0) * group_size;
  // Sums over the covered (layer, KV head) pairs, one column of n slots each.
  enum Column { mass, entropy_mass, queries, value_norm, key_norm, last, expected_mass, columns };
  const std::size_t un = std::size_t(n);
  std::vector<float> sums(un * (columns + std::size_t(query_heads)), 0.0f);
  auto column = [&](int c) { return sums.data() + std::size_t(c) * un; };
  auto add = [n](float* DC_RESTRICT to, const float* DC_RESTRICT from) {
    for (int i = 0; i < n; ++i) to[i] += from[i];
  };
  for (int l = l0; l < l1; ++l) {
    if (!evictable[std::size_t(l)]) continue;
    const HostStatistics& layer = stats[std::size_t(l)];
    auto stat = [&](int h, int r) { return layer.data + (std::int64_t(h) * rows_per_head + r) * layer.stride; };
    for (int h = h0; h < h1; ++h) {
      add(column(mass), stat(h, kStatMass));
      add(column(entropy_mass), stat(h, kStatEntropyMass));
      add(column(value_norm), stat(h, kStatValueNorm));
      add(column(key_norm), stat(h, kStatKeyNorm));
      add(column(last), stat(h, kStatLastMass));
      if (f.has_expected_attention) add(column(expected_mass), expected[std::size_t(l)].data() + std::size_t(h) * un);
      for (int q = 0; q < group_size; ++q)
        add(column(columns + (h - h0) * group_size + q), stat(h, kStatHeadMass + q));
    }
    // Every KV head of a layer sees the same queries for the same slot: count them once.
    add(column(queries), stat(h0, kStatQueries));
  }
  // Mean mass per observed query of each query head: their sum and sum of squares per slot.
  std::vector<float> head_sum(un, 0.0f), head_squares(un, 0.0f);
  {
    const float* DC_RESTRICT seen = column(queries);
    float* DC_RESTRICT sum = head_sum.data();
    float* DC_RESTRICT squares = head_squares.data();
    for (int q = 0; q < query_heads; ++q) {
      const float* DC_RESTRICT m = column(columns + q);
      for (int i = 0; i < n; ++i) {
        const float per_query = math::feature_alpha(m[i], seen[i], 1);
        sum[i] += per_query;
#if defined(__FMA__)
        // Fused where the build has FMA, as compilers contract the per-row form; a vectorised
        // loop is not always contracted, and the features would then differ in the last bit.
        squares[i] = std::fma(per_query, per_query, squares[i]);
#else
        squares[i] += per_query * per_query;
#endif
      }
    }
  }
  // The rows' features and raw statistics, one output column per restrict pointer: written
  // through f.column(...)[row] in one loop the compiler had to assume the columns alias and
  // kept it scalar (a division at a time: 0.5 ms of a 4.9 ms decode-time eviction at B = 2048
  // on SmolLM2). The same operations per row, so the same bits.
  const std::size_t at = std::size_t(row0);
  float* DC_RESTRICT alpha = f.column(Feature::alpha) + at;
  float* DC_RESTRICT value_norm_out = f.column(Feature::value_norm) + at;
  float* DC_RESTRICT variance = f.column(Feature::head_variance) + at;
  float* DC_RESTRICT entropy = f.column(Feature::entropy) + at;
  float* DC_RESTRICT position_out = f.column(Feature::position) + at;
  std::int32_t* DC_RESTRICT group = f.group.data() + at;
  std::int32_t* DC_RESTRICT slot = f.slot.data() + at;
  std::int32_t* DC_RESTRICT position_raw = f.position.data() + at;
  float* DC_RESTRICT accumulated = f.accumulated_mass.data() + at;
  float* DC_RESTRICT last_mass = f.last_query_mass.data() + at;
  float* DC_RESTRICT key_norm_out = f.key_norm.data() + at;
  float* DC_RESTRICT expected_out = f.expected_attention.data() + at;
  const float* DC_RESTRICT mass_in = column(mass);
  const float* DC_RESTRICT queries_in = column(queries);
  const float* DC_RESTRICT entropy_in = column(entropy_mass);
  const float* DC_RESTRICT value_norm_in = column(value_norm);
  const float* DC_RESTRICT key_norm_in = column(key_norm);
  const float* DC_RESTRICT last_in = column(last);
  const float* DC_RESTRICT expected_in = column(expected_mass);
  const float* DC_RESTRICT sum_in = head_sum.data();
  const float* DC_RESTRICT squares_in = head_squares.data();
  const std::int32_t* DC_RESTRICT position_in = positions.data();
  const int latest = f.latest_position;
  const float layers_f = float(layers), query_heads_f = float(query_heads);
  // One short loop per output column or two: GCC vectorises each, not one loop writing twelve.
  for (int i = 0; i < n; ++i) {
    alpha[i] = math::feature_alpha(mass_in[i], queries_in[i], query_heads);
    accumulated[i] = mass_in[i];
  }
  for (int i = 0; i < n; ++i) entropy[i] = math::feature_entropy(entropy_in[i], mass_in[i]);
  for (int i = 0; i < n; ++i) variance[i] = math::variance_from_sums(sum_in[i], squares_in[i], query_heads);
  for (int i = 0; i < n; ++i) value_norm_out[i] = value_norm_in[i] / covered;
  for (int i = 0; i < n; ++i) key_norm_out[i] = key_norm_in[i] / covered;
  for (int i = 0; i < n; ++i) expected_out[i] = expected_in[i] / covered;
  for (int i = 0; i < n; ++i) last_mass[i] = last_in[i] / layers_f / query_heads_f;
  for (int i = 0; i < n; ++i) {
    position_out[i] = math::feature_position(position_in[i], latest);
    position_raw[i] = position_in[i];
    group[i] = g;
    slot[i] = i;
  }
  f.group_value_norm_sum[std::size_t(g)] =  // the rows just written, still in cache
      n > 0 ? value_norm_sum(f.column(Feature::value_norm) + row0, n) : 0.0;
}

}  // namespace detail

// Features of every row of the cache's evictable layers at the given granularity. Coarser
// granularities need the slots they merge to be the same: shared needs every evictable layer and
// head to hold the same positions, layer needs the heads of each layer to (they do unless finer
// keep-sets were used).
//
// gather_features_into(f, ...) writes into an existing set, every field replaced: a decoder
// that gathers every chunk tokens reuses one set, whose columns then keep their length (B +
// chunk rows per group each time) and are not zero-filled again (13 columns, 9.7 MB at B =
// 2048 on SmolLM2, filled on one thread: 0.3 ms of a 5.7 ms decode-time eviction).
template <Backend B>
void gather_features_into(TokenFeatures& f, const Context<B>& ctx, const KVCache<B>& cache,
                          Granularity granularity = Granularity::shared) {
  const int layers = cache.num_layers(), kv_heads = cache.num_kv_heads();
  const int group_size = cache.num_heads() / kv_heads;
  std::vector<bool> evictable(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) evictable[std::size_t(l)] = cache.evictable(l);
  const int reference = cache.first_evictable_layer();
  if (granularity != Granularity::head)
    for (int l = 0; l < layers; ++l)
      DC_CHECK(!evictable[std::size_t(l)] || cache.heads_share_slots(l), "gather_features: the kv heads of layer ", l,
               " hold different slots (per-head keep-sets): gather at head granularity");
  if (granularity == Granularity::shared)
    for (int l = reference + 1; l < layers; ++l)
      DC_CHECK(!evictable[std::size_t(l)] || cache.host_positions(l) == cache.host_positions(reference),
               "gather_features: layers ", reference, " and ", l,
               " hold different slots (per-layer keep-sets): gather at layer or head granularity");

  f.granularity = granularity;
  f.size = 0;
  f.latest_position = cache.next_position() - 1;
  f.num_layers = layers;
  f.groups.clear();
  // Each layer's statistics on the host, [kv_heads, rows, stride]: read in place on the CPU; a
  // copy of the valid slots (stride = length) from a GPU.
  const std::size_t block = std::size_t(kv_heads) * cache.stat_rows();
  std::vector<detail::HostStatistics> stats(static_cast<std::size_t>(layers));
  std::vector<std::vector<float>> host_copies(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    if (!evictable[std::size_t(l)]) continue;
    const std::size_t n = std::size_t(cache.length(l));
    if constexpr (std::same_as<B, cpu>) {
      stats[std::size_t(l)] = {cache.stats(l), cache.capacity(l)};
    } else {
      auto& copy = host_copies[std::size_t(l)];
      copy.resize(block * n);
      copy_rows_to_host(ctx, copy.data(), cache.stats(l), std::size_t(cache.capacity(l)), n, block);
      stats[std::size_t(l)] = {copy.data(), std::int64_t(n)};
    }
  }
  std::vector<std::vector<float>> expected(static_cast<std::size_t>(layers));
  f.has_expected_attention = cache.collecting_queries();
  if (f.has_expected_attention)
    for (int l = 0; l < layers; ++l) {
      if (!evictable[std::size_t(l)]) continue;
      const std::size_t n = std::size_t(cache.length(l));
      std::vector<float> value_norm(std::size_t(kv_heads) * n);
      const detail::HostStatistics& layer = stats[std::size_t(l)];
      for (int h = 0; h < kv_heads; ++h)
        std::copy_n(layer.data + (std::int64_t(h) * cache.stat_rows() + kStatValueNorm) * layer.stride,
                    n, value_norm.data() + std::size_t(h) * n);
      expected[std::size_t(l)] = expected_attention(ctx, cache, l, value_norm);
    }
  // The groups in row order: the layers and KV heads each covers, and its slots' positions.
  struct Plan {
    int l0, l1, h0, h1;
    const std::vector<std::int32_t>* positions;
  };
  std::vector<Plan> plans;
  switch (granularity) {
    case Granularity::shared:
      plans.push_back({0, layers, 0, kv_heads, &cache.host_positions(reference)});
      break;
    case Granularity::layer:
      for (int l = 0; l < layers; ++l)
        if (evictable[std::size_t(l)]) plans.push_back({l, l + 1, 0, kv_heads, &cache.host_positions(l)});
      break;
    case Granularity::head:
      for (int l = 0; l < layers; ++l)
        if (evictable[std::size_t(l)])
          for (int h = 0; h < kv_heads; ++h) plans.push_back({l, l + 1, h, h + 1, &cache.host_positions(l, h)});
      break;
  }
  for (const Plan& p : plans) {
    const int n = int(p.positions->size());
    f.groups.push_back({p.l0, p.l1, p.h0, p.h1, f.size, f.size + n});
    f.size += n;
  }
  const std::size_t rows = std::size_t(f.size);
  for (auto& column : f.columns) column.resize(rows);
  for (auto* column : {&f.group, &f.slot, &f.position}) column->resize(rows);
  for (auto* column : {&f.accumulated_mass, &f.last_query_mass, &f.key_norm, &f.expected_attention})
    column->resize(rows);
  f.group_value_norm_sum.resize(f.groups.size());
  // Groups write disjoint rows: one task each (90 at head granularity on SmolLM2), on any thread
  // with the same result. Each thread takes a contiguous share of the rows, as the features'
  // check and the policies' scoring after it do (cpu_detail::contiguous_share).
  const int num_plans = int(plans.size());
  DC_OMP(parallel if (num_plans > 1 && rows > 4096))
  {
    const int thread = cpu_detail::thread_num(), threads = cpu_detail::num_threads();
    for (int g = 0; g < num_plans; ++g) {
      const FeatureGroup& group = f.groups[std::size_t(g)];
      if (cpu_detail::contiguous_share(group.row_begin, group.row_end, f.size, threads) != thread) continue;
      const Plan& p = plans[std::size_t(g)];
      detail::write_group_rows(f, g, group.row_begin, stats, expected, evictable, *p.positions, p.l0, p.l1, p.h0,
                               p.h1, group_size);
    }
  }
}

template <Backend B>
TokenFeatures gather_features(const Context<B>& ctx, const KVCache<B>& cache,
                              Granularity granularity = Granularity::shared) {
  TokenFeatures f;
  gather_features_into(f, ctx, cache, granularity);
  return f;
}

}  // namespace dc
