#pragma once
// Eviction where the cache lives, for policies whose scores are a ScoreRule (policy/policy.hpp).
//
// EvictingDecoder::evict() tries this first when the policy gives a rule and the request is the
// plain one: head granularity, no keep-set selector (the trainer's sampled sets), one budget for
// every layer, no protected sink or recent slots (a rule's own recent window is part of its
// scores). evict_in_place then either evicts (true) or declines (false), and the decoder falls
// back to gathering the features to the host, which every policy supports.
//
// The CPU overload here always declines: on the CPU the features are formed where the cache is
// already, and its path is the reference the CUDA one is tested against. in_place_eviction.cuh
// has the CUDA overload (the same keep-sets, chosen and applied on the device).
#include <cstdint>

#include "../cache/kv_cache.hpp"
#include "../core/backend.hpp"
#include "../core/buffer.hpp"
#include "../policy/policy.hpp"

namespace dc {

// Device scratch an in-place eviction reuses from one eviction to the next (grown on demand).
template <Backend B>
struct InPlaceEvictionScratch {
  Buffer<float, B> scores;                  // [groups, len]
  Buffer<std::int32_t, B> positions;        // [groups, len]
  Buffer<std::int32_t, B> picks, sorted;    // [groups, budget]: top rows, then ascending
  Buffer<std::int32_t, B> slots;            // [groups, budget]: kept slots
  Buffer<std::int32_t, B> kept_positions;   // [groups, budget]
  Buffer<std::int32_t, B> offsets;          // [groups + 1]
};

inline bool evict_in_place(const Context<cpu>&, KVCache<cpu>&, const ScoreRule&, int,
                           InPlaceEvictionScratch<cpu>&) {
  return false;
}

}  // namespace dc
