#pragma once
// The parameters every attention kernel needs, passed by value to CPU and CUDA code.
#include "../core/config.hpp"

namespace dc {

struct AttentionShape {
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // key/value heads
  int head_dim = 0;
  int window = 0;        // sliding window in positions, 0 = unlimited
  float scale = 0.0f;    // 1/sqrt(head_dim)
  int capacity = 0;      // slots per KV head in the cache layout [kv_heads, capacity, head_dim]
};


// Where attention statistics go for one layer: the layer's block [kv_heads,
// stat_rows_per_kv_head(group), capacity] (math/features.hpp; null: no statistics), and the first query of the chunk that is observed (queries
// t >= first_observed accumulate; the chunk's queries are in position order).
struct AttentionStats {
  float* block = nullptr;
  int first_observed = 0;
};

}  // namespace dc
