#pragma once
// Key and query positions of a cache as the attention tests need them: per KV head, len cached
// slots of a cache of `capacity`, the last n of which are the chunk's own queries.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace dc_test {

// Positions of len cached slots per KV head, [kv_heads, capacity]: 0..len-1 in every head, or
// (compacted) per head its own sorted random subset of 0..2*len-n-1 followed by the n newest
// positions 2*len-n..2*len-1 (the chunk's own tokens, in every head), as a cache looks after
// per-head eviction. query_pos: those n newest positions.
struct CachedPositions {
  std::vector<std::int32_t> key_pos, query_pos;
};
inline CachedPositions cached_positions(int len, int capacity, int kv_heads, int n, bool compacted) {
  CachedPositions c;
  c.key_pos.assign(std::size_t(kv_heads) * capacity, 0);
  for (int h = 0; h < kv_heads; ++h) {
    std::int32_t* head = c.key_pos.data() + std::size_t(h) * capacity;
    if (compacted) {
      std::mt19937 rng(70 + unsigned(len) + 1000u * unsigned(h));
      std::vector<std::int32_t> older(static_cast<std::size_t>(2 * len - n));
      std::iota(older.begin(), older.end(), 0);
      std::shuffle(older.begin(), older.end(), rng);
      std::sort(older.begin(), older.begin() + (len - n));
      std::copy(older.begin(), older.begin() + (len - n), head);
      for (int i = 0; i < n; ++i) head[len - n + i] = 2 * len - n + i;
    } else {
      std::iota(head, head + len, 0);
    }
  }
  c.query_pos.assign(c.key_pos.begin() + (len - n), c.key_pos.begin() + len);
  return c;
}

}  // namespace dc_test
