#pragma once
// Applying the keep-sets of feature groups (cache/features.hpp) to a cache: group g keeps the
// slots keep[g] (strictly ascending) in every evictable layer and KV head it covers. One path for
// every granularity: each layer is compacted once with per-head keep-sets, repeated for the heads
// a shared or per-layer group covers. Windowed layers that are not evictable (Gemma 3's local
// layers) are then trimmed to their window, exactly (KVCache::trim_to_windows).
#include <concepts>
#include <cstdint>
#include <vector>

#include "../core/config.hpp"
#include "features.hpp"
#include "kv_cache.hpp"

namespace dc {

using KeepSets = std::vector<std::vector<std::int32_t>>;  // per group: kept slots, ascending

template <Backend B>
void compact_groups(const Context<B>& ctx, KVCache<B>& cache, const TokenFeatures& f,
                    const KeepSets& keep) {
  DC_CHECK(keep.size() == f.groups.size(), "compact_groups: ", keep.size(), " keep-sets for ",
           f.groups.size(), " groups");
  const int kv_heads = cache.num_kv_heads(), layers = cache.num_layers();
  std::vector<int> owner(static_cast<std::size_t>(kv_heads));
  // Every layer's [kv_heads, count] keep-set, checked before anything moves.
  std::vector<std::vector<std::int32_t>> flat(static_cast<std::size_t>(layers));
  std::vector<char> evictable(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    evictable[std::size_t(l)] = cache.evictable(l);
    if (!evictable[std::size_t(l)]) continue;
    for (int h = 0; h < kv_heads; ++h) {
      owner[std::size_t(h)] = -1;
      for (int g = 0; g < f.num_groups(); ++g)
        if (f.groups[std::size_t(g)].covers(l, h)) owner[std::size_t(h)] = g;
      DC_CHECK(owner[std::size_t(h)] >= 0, "compact_groups: no group covers layer ", l,
               ", kv head ", h);
    }
    const std::size_t count = keep[std::size_t(owner[0])].size();
    auto& layer_keep = flat[std::size_t(l)];
    for (int h = 0; h < kv_heads; ++h) {
      const auto& k = keep[std::size_t(owner[std::size_t(h)])];
      DC_CHECK(k.size() == count, "compact_groups: the kv heads of layer ", l, " keep ", count,
               " and ", k.size(), " slots; a layer's heads must keep the same number");
      layer_keep.insert(layer_keep.end(), k.begin(), k.end());
    }
    cache.check_heads_keep(l, layer_keep);
  }
  // The moves: layers are independent, and on the CPU they run in parallel (one thread moving
  // every layer's K/V rows was a third of a decode-time eviction: the kept rows after the first
  // evicted slot all shift). Other backends queue their copies in order, outside any OpenMP
  // region, so that an error they raise reaches the caller as a dc::Error.
  auto move = [&](int l) {
    if (evictable[std::size_t(l)]) cache.move_heads(ctx, l, flat[std::size_t(l)]);
  };
  if constexpr (std::same_as<B, cpu>) {
    DC_OMP(parallel for schedule(dynamic) if (layers > 1))
    for (int l = 0; l < layers; ++l) move(l);
  } else {
    for (int l = 0; l < layers; ++l) move(l);
  }
  cache.trim_to_windows(ctx);
}

}  // namespace dc
