#pragma once
// TokenFeatures: what an eviction policy sees — one row per cached slot, gathered from the
// cache's per-layer statistics (the formulas are in math/features.hpp).
//
// Features of a shared keep-set average over all layers; for per-layer keep-sets, gather one
// layer at a time (gather_layer_features).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../core/copy.hpp"
#include "../core/finite.hpp"
#include "../math/features.hpp"
#include "kv_cache.hpp"

namespace dc {

struct TokenFeatures {
  static constexpr int kNumFeatures = 5;  // alpha, vnorm, sigma, H, pos

  int size = 0;             // cached slots
  int latest_position = 0;  // position of the newest token
  std::vector<std::int32_t> position;
  // The five DistillCache features.
  std::vector<float> alpha;              // mean attention mass received
  std::vector<float> value_norm;         // mean ||v||_2
  std::vector<float> head_variance;      // variance across heads of the mass received
  std::vector<float> entropy;            // attention-weighted entropy of attending queries
  std::vector<float> relative_position;  // position / latest position
  // Raw statistics the baselines use.
  std::vector<float> accumulated_mass;  // sum over layers, heads, observed queries (H2O)
  std::vector<float> last_query_mass;   // mean over layers of the newest query's mass (TOVA)
  std::vector<float> key_norm;          // mean ||k||_2 (KNorm)

  // Throws dc::Error naming the first problem: a column whose length is not `size`, or a
  // non-finite value (which would make any policy's keep-set arbitrary). The decoder checks
  // every gathered set before a policy sees it; call it on features built by hand.
  void validate() const {
    DC_CHECK(size >= 0, "features: negative size ", size);
    DC_CHECK(position.size() == std::size_t(size), "features: 'position' has ", position.size(),
             " entries for ", size, " slots");
    const std::pair<const char*, const std::vector<float>*> columns[] = {
        {"alpha", &alpha},
        {"value_norm", &value_norm},
        {"head_variance", &head_variance},
        {"entropy", &entropy},
        {"relative_position", &relative_position},
        {"accumulated_mass", &accumulated_mass},
        {"last_query_mass", &last_query_mass},
        {"key_norm", &key_norm}};
    for (const auto& [name, column] : columns) {
      DC_CHECK(column->size() == std::size_t(size), "features: '", name, "' has ", column->size(),
               " entries for ", size, " slots");
      check_all_finite(*column, detail::concat("features: '", name, "'"));
    }
  }

  // Row-major [size, 5] matrix of the features, the learned policy's input.
  std::vector<float> matrix() const {
    std::vector<float> x(std::size_t(size) * kNumFeatures);
    for (int i = 0; i < size; ++i) {
      float* row = x.data() + std::size_t(i) * kNumFeatures;
      row[0] = alpha[std::size_t(i)];
      row[1] = value_norm[std::size_t(i)];
      row[2] = head_variance[std::size_t(i)];
      row[3] = entropy[std::size_t(i)];
      row[4] = relative_position[std::size_t(i)];
    }
    return x;
  }
};

// Features over layers [first_layer, last_layer) of the cache; those layers must hold the same
// slots (a shared keep-set), as they do unless compact_layer() was used.
template <Backend B>
TokenFeatures gather_features(const Context<B>& ctx, const KVCache<B>& cache, int first_layer,
                              int last_layer) {
  DC_CHECK(0 <= first_layer && first_layer < last_layer && last_layer <= cache.num_layers(),
           "gather_features: layer range [", first_layer, ", ", last_layer, ") invalid");
  const int n = cache.length(first_layer), heads = cache.num_heads(), cap = cache.capacity();
  const int layers = last_layer - first_layer;
  for (int l = first_layer; l < last_layer; ++l)
    DC_CHECK(cache.host_positions(l) == cache.host_positions(first_layer),
             "gather_features: layers ", first_layer, " and ", l,
             " hold different slots (per-layer keep-sets): gather one layer at a time");
  TokenFeatures f;
  f.size = n;
  f.latest_position = cache.next_position() - 1;
  f.position = cache.host_positions(first_layer);
  for (auto* v : {&f.alpha, &f.value_norm, &f.head_variance, &f.entropy, &f.relative_position,
                  &f.accumulated_mass, &f.last_query_mass, &f.key_norm})
    v->assign(std::size_t(n), 0.0f);
  if (n == 0) return f;

  const int rows = stat_rows(heads);
  std::vector<float> block(std::size_t(rows) * n);
  std::vector<float> mass(std::size_t(n), 0.0f), entropy_mass(std::size_t(n), 0.0f),
      queries(std::size_t(n), 0.0f), head_mass(std::size_t(heads) * n, 0.0f);
  for (int l = first_layer; l < last_layer; ++l) {
    for (int r = 0; r < rows; ++r)
      copy_to_host(ctx, block.data() + std::size_t(r) * n, cache.stats(l) + std::int64_t(r) * cap,
                   std::size_t(n));
    auto row = [&](int r) { return block.data() + std::size_t(r) * n; };
    for (int i = 0; i < n; ++i) {
      mass[std::size_t(i)] += row(kStatMass)[i];
      entropy_mass[std::size_t(i)] += row(kStatEntropyMass)[i];
      queries[std::size_t(i)] += row(kStatQueries)[i];
      f.value_norm[std::size_t(i)] += row(kStatValueNorm)[i] / float(layers);
      f.key_norm[std::size_t(i)] += row(kStatKeyNorm)[i] / float(layers);
      f.last_query_mass[std::size_t(i)] += row(kStatLastMass)[i] / float(layers);
      for (int h = 0; h < heads; ++h) head_mass[std::size_t(h) * n + i] += row(kStatHeadMass + h)[i];
    }
  }
  for (int i = 0; i < n; ++i) {
    const std::size_t s = std::size_t(i);
    f.accumulated_mass[s] = mass[s];
    f.alpha[s] = math::feature_alpha(mass[s], queries[s], heads);
    f.entropy[s] = math::feature_entropy(entropy_mass[s], mass[s]);
    f.relative_position[s] = math::feature_position(f.position[s], f.latest_position);
    // Per-head mean mass per observed query, then its variance across heads.
    float sum = 0.0f, sum_squares = 0.0f;
    for (int h = 0; h < heads; ++h) {
      const float m = math::feature_alpha(head_mass[std::size_t(h) * n + s], queries[s], 1);
      sum += m;
      sum_squares += m * m;
    }
    f.head_variance[s] = math::variance_from_sums(sum, sum_squares, heads);
  }
  return f;
}

template <Backend B>
TokenFeatures gather_features(const Context<B>& ctx, const KVCache<B>& cache) {
  return gather_features(ctx, cache, 0, cache.num_layers());
}

template <Backend B>
TokenFeatures gather_layer_features(const Context<B>& ctx, const KVCache<B>& cache, int layer) {
  return gather_features(ctx, cache, layer, layer + 1);
}

}  // namespace dc
