#pragma once
// CPU RoPE, applied in place to the query and key rows of a chunk, rotate-half convention
// (the library's internal one; see math/rope.hpp).
#include <cstdint>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/rope.hpp"

namespace dc {

// q[n, q_heads*head_dim], k[n, kv_heads*head_dim]; token t sits at position pos[t].
inline void rope(const Context<cpu>&, float* q, float* k, const std::int32_t* pos, int n,
                 int q_heads, int kv_heads, int head_dim, float theta) {
  const int pairs = head_dim / 2;
DC_OMP(parallel for schedule(static) if (n > 1))
  for (int t = 0; t < n; ++t) {
    // cos/sin depend only on (position, pair): compute once per token, reuse for every head.
    thread_local std::vector<float> cs;
    cs.resize(static_cast<std::size_t>(2 * pairs));
    for (int i = 0; i < pairs; ++i) {
      const float angle = math::rope_angle(pos[t], math::rope_inv_freq(i, head_dim, theta));
      cs[std::size_t(2 * i)] = cosf(angle);
      cs[std::size_t(2 * i + 1)] = sinf(angle);
    }
    auto rotate_rows = [&](float* base, int heads) {
      for (int h = 0; h < heads; ++h) {
        float* v = base + std::int64_t(h) * head_dim;
        for (int i = 0; i < pairs; ++i)
          math::rope_rotate(v[math::rope_half_first(i)], v[math::rope_half_second(i, head_dim)],
                            cs[std::size_t(2 * i)], cs[std::size_t(2 * i + 1)]);
      }
    };
    rotate_rows(q + std::int64_t(t) * q_heads * head_dim, q_heads);
    rotate_rows(k + std::int64_t(t) * kv_heads * head_dim, kv_heads);
  }
}

}  // namespace dc
