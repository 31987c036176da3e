#pragma once
// Rotary position embedding (Su et al. 2021).
//
// Pair i of a head (0 <= i < head_dim/2) is rotated by angle pos * theta^(-2i/head_dim).
// Two conventions place the pair differently inside the head vector:
//   rotate-half (Hugging Face, GPT-NeoX): elements (i, i + head_dim/2)   <- the library's own
//   interleaved (GPT-J, llama.cpp/GGUF):  elements (2i, 2i + 1)
// They are the same rotation up to a permutation of the head's elements, which is why GGUF
// stores Q/K rows permuted; loaders undo that permutation so the forward pass has one convention.
// The angle is formed in fp32 exactly as Hugging Face does (fp32 inverse frequency times fp32
// position), so long positions round the same way as the reference.
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

DC_HD float rope_inv_freq(int pair, int head_dim, float theta) {
  return 1.0f / powf(theta, static_cast<float>(2 * pair) / static_cast<float>(head_dim));
}

DC_HD float rope_angle(int pos, float inv_freq) { return static_cast<float>(pos) * inv_freq; }

// Rotates (a, b) by the angle whose cosine and sine are given.
DC_HD void rope_rotate(float& a, float& b, float cos_t, float sin_t) {
  const float x = a, y = b;
  a = x * cos_t - y * sin_t;
  b = y * cos_t + x * sin_t;
}

// Index of the two elements of pair i in each convention.
DC_HD int rope_half_first(int pair) { return pair; }
DC_HD int rope_half_second(int pair, int head_dim) { return pair + head_dim / 2; }
DC_HD int rope_interleaved_first(int pair) { return 2 * pair; }
DC_HD int rope_interleaved_second(int pair) { return 2 * pair + 1; }

// Row permutation that turns interleaved-convention Q/K weights back into rotate-half ones:
// output row r of a head takes input row rope_unpermute_source(r). Applying rotate-half RoPE to
// the unpermuted projection equals applying interleaved RoPE to the original one.
DC_HD int rope_unpermute_source(int r, int head_dim) {
  const int half = head_dim / 2;
  return r < half ? 2 * r : 2 * (r - half) + 1;
}

}  // namespace dc::math
