#pragma once
// The expected attention of every cached slot of a layer (math/expected_attention.hpp): for each
// KV head, the softmax over its slots of the expected logits of its group's query heads, averaged
// over the group and scaled by ||v||, as kvpress's ExpectedAttentionPress scores keys. Slots
// before the statistics' first position (the attention sinks) get the head's largest score, so a
// top-B keeps them. Host code: the keys are copied from the backend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../core/copy.hpp"
#include "../math/expected_attention.hpp"
#include "kv_cache.hpp"

namespace dc {

// value_norm: [kv_heads, length(layer)] (each slot's ||v|| of its KV head). Returns
// [kv_heads, length(layer)].
template <Backend B>
std::vector<float> expected_attention(const Context<B>& ctx, const KVCache<B>& cache, int layer,
                                      const std::vector<float>& value_norm) {
  const QueryStatistics& qs = cache.query_statistics();
  DC_CHECK(qs.active(), "expected attention: the cache collected no query statistics");
  const int d = cache.head_dim(), kv_heads = cache.num_kv_heads(), cap = cache.capacity(layer);
  const int group = cache.num_heads() / kv_heads, n = cache.length(layer), half = d / 2;
  DC_CHECK(value_norm.size() == std::size_t(kv_heads) * n, "expected attention: ",
           value_norm.size(), " value norms for ", kv_heads, " x ", n, " slots");
  // The mean rotation of the next future_positions positions.
  const std::size_t dims = std::size_t(d), halves = std::size_t(half), slots = std::size_t(n);
  std::vector<double> cbar(halves), sbar(halves);
  for (int i = 0; i < half; ++i)
    math::mean_rotation(cache.next_position(), qs.spec().future_positions, i, d, qs.rope_theta(),
                        cbar[std::size_t(i)], sbar[std::size_t(i)]);

  std::vector<float> keys(slots * dims), out(std::size_t(kv_heads) * slots, 0.0f);
  std::vector<double> mean(dims), cov(dims * dims), mu(dims), rotated(dims * dims), column(dims),
      image(dims), logits(slots), mass(slots);
  for (int g = 0; g < kv_heads; ++g) {
    cache.with_kv(layer, [&](const auto* k, const auto*) {  // widened to fp32 from the storage type
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
      const T* head = k + std::int64_t(g) * cap * d;
      if constexpr (std::is_same_v<T, float>) {
        copy_to_host(ctx, keys.data(), head, keys.size());
      } else {
        std::vector<T> stored(keys.size());
        copy_to_host(ctx, stored.data(), head, stored.size());
        for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = to_float_any(stored[i]);
      }
    });
    const auto& positions = cache.host_positions(layer, g);
    std::fill(mass.begin(), mass.end(), 0.0);
    for (int h = g * group; h < (g + 1) * group; ++h) {
      qs.mean_and_covariance(layer, h, mean.data(), cov.data());
      math::apply_mean_rotation(mean.data(), mu.data(), cbar.data(), sbar.data(), d);
      // rotated = R cov R^T: R applied to every column, then to every row.
      for (int j = 0; j < d; ++j) {
        for (int i = 0; i < d; ++i) column[std::size_t(i)] = cov[std::size_t(i) * d + j];
        math::apply_mean_rotation(column.data(), image.data(), cbar.data(), sbar.data(), d);
        for (int i = 0; i < d; ++i) rotated[std::size_t(i) * d + j] = image[std::size_t(i)];
      }
      for (int i = 0; i < d; ++i) {
        double* row = rotated.data() + std::size_t(i) * d;
        math::apply_mean_rotation(row, image.data(), cbar.data(), sbar.data(), d);
        std::copy(image.begin(), image.end(), row);
      }
      double max_logit = -INFINITY;
      for (int j = 0; j < n; ++j) {
        if (positions[std::size_t(j)] < qs.spec().from) continue;  // sinks: not in the softmax
        logits[std::size_t(j)] =
            math::expected_logit(keys.data() + std::size_t(j) * d, mu.data(), rotated.data(), d);
        max_logit = std::max(max_logit, logits[std::size_t(j)]);
      }
      double z = 0.0;
      for (int j = 0; j < n; ++j)
        if (positions[std::size_t(j)] >= qs.spec().from) z += std::exp(logits[std::size_t(j)] - max_logit);
      for (int j = 0; j < n; ++j)
        if (positions[std::size_t(j)] >= qs.spec().from)
          mass[std::size_t(j)] += std::exp(logits[std::size_t(j)] - max_logit) / z / group;
    }
    float* head_out = out.data() + std::size_t(g) * n;
    float best = 0.0f;
    for (int j = 0; j < n; ++j) {
      if (positions[std::size_t(j)] < qs.spec().from) continue;
      head_out[j] = float(mass[std::size_t(j)]) * value_norm[std::size_t(g) * n + std::size_t(j)];
      best = std::max(best, head_out[j]);
    }
    for (int j = 0; j < n; ++j)
      if (positions[std::size_t(j)] < qs.spec().from) head_out[j] = best;
  }
  return out;
}

}  // namespace dc
