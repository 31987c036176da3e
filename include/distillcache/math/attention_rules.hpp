#pragma once
// Which keys a query may attend to, and which KV head serves a query head.
//
// Masks are decided from original token positions, not cache slots: after eviction the cache is
// compacted, but a kept token keeps the position its key was rotated with, so causality and the
// sliding window stay correct for any keep-set.
#include "../core/config.hpp"

namespace dc::math {

// Causal + optional sliding window (window <= 0: unlimited). A query at position p sees key k
// iff k <= p and p - k < window: the window counts the query itself, as Mistral and Hugging
// Face define it.
DC_HD bool attends(int query_pos, int key_pos, int window) {
  return key_pos <= query_pos && (window <= 0 || query_pos - key_pos < window);
}

// Grouped-query attention: consecutive query heads share one KV head.
DC_HD int kv_head_of(int query_head, int num_heads, int num_kv_heads) {
  return query_head / (num_heads / num_kv_heads);
}

}  // namespace dc::math
