#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// exact cuRAND view of it, so the CPU backend draws the very bits a CUDA kernel gets from
// curand_init + curand / curand_uniform, and both backends sample the same keep-sets.
//
// cuRAND's curandStatePhilox4_32_10_t, as curand_init(seed, subsequence, offset, &s) sets it up
// (curand_kernel.h, CUDA 13):
//   key     = {low 32 bits of seed, high 32 bits of seed}
//   counter = {low, high of offset / 4, low, high of subsequence}  (128 bits, word 0 lowest)
//   the next curand(&s) is word offset % 4 of philox4x32_10(counter, key); later draws walk the
//   words, then the counter's low 64 bits step by one (a block of 4 outputs per step).
// (curand_init adds offset / 4 < 2^62 to a zero low half, so no carry into the subsequence.)
//
// Being counter-based, a draw is a pure function of (seed, subsequence, offset): no state is
// carried, so any row's noise is computed independently on any thread or backend.
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"

namespace dc::math {

// 128 bits of counter or output, word 0 the least significant (cuRAND's uint4 x, y, z, w).
struct PhiloxBlock {
  std::uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
};

// Random123 / cuRAND constants: round multipliers and the Weyl key increments.
inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// One round: two 32x32->64 multiplies, the high halves mixed with the other words and the key.
DC_HD PhiloxBlock philox_round(PhiloxBlock c, std::uint32_t k0, std::uint32_t k1) {
  // The 64-bit product is exact on both sides (nvcc lowers it to mul.wide.u32).
  const std::uint64_t p0 = std::uint64_t(kPhiloxM0) * c.w0;
  const std::uint64_t p1 = std::uint64_t(kPhiloxM1) * c.w2;
  PhiloxBlock r;
  r.w0 = std::uint32_t(p1 >> 32) ^ c.w1 ^ k0;
  r.w1 = std::uint32_t(p1);
  r.w2 = std::uint32_t(p0 >> 32) ^ c.w3 ^ k1;
  r.w3 = std::uint32_t(p0);
  return r;
}

// The 10-round bijection of the counter under key {k0, k1}; the key gains the Weyl constants
// between rounds.
DC_HD PhiloxBlock philox4x32_10(PhiloxBlock counter, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;  // unsigned: wraps modulo 2^32 as specified
      k1 += kPhiloxW1;
    }
    counter = philox_round(counter, k0, k1);
  }
  return counter;
}

// The counter block cuRAND reads for (subsequence, block) with block = offset / 4.
DC_HD PhiloxBlock curand_philox_counter(std::uint64_t subsequence, std::uint64_t block) {
  PhiloxBlock c;
  c.w0 = std::uint32_t(block);
  c.w1 = std::uint32_t(block >> 32);
  c.w2 = std::uint32_t(subsequence);
  c.w3 = std::uint32_t(subsequence >> 32);
  return c;
}

// What curand(&s) returns first after curand_init(seed, subsequence, offset, &s) for
// curandStatePhilox4_32_10_t. Equivalently the offset-th draw after curand_init(seed,
// subsequence, 0, &s).
DC_HD std::uint32_t curand_philox_bits(std::uint64_t seed, std::uint64_t subsequence,
                                       std::uint64_t offset) {
  const PhiloxBlock out = philox4x32_10(curand_philox_counter(subsequence, offset / 4),
                                        std::uint32_t(seed), std::uint32_t(seed >> 32));
  // A switch, not an array index: keeps the block in registers on the device.
  switch (offset % 4) {
    case 0: return out.w0;
    case 1: return out.w1;
    case 2: return out.w2;
    default: return out.w3;
  }
}

// curand_uniform's map from 32 bits to (0, 1]: x * 2^-32 + 2^-33 in float (curand_uniform.h:
// CURAND_2POW32_INV, which is exactly 2^-32). The product of float(x) and a power of two is
// exact, so the result is one rounding of the sum whether or not the compiler fuses it into an
// FMA: host and device agree bit for bit. 0xffffffff rounds to exactly 1.0f.
inline constexpr float kTwoPowMinus32 = 2.3283064365386963e-10f;  // 2^-32
static_assert(kTwoPowMinus32 == 1.0f / 4294967296.0f, "2^-32 must be exact");
DC_HD float curand_uniform_from_bits(std::uint32_t x) {
  return float(x) * kTwoPowMinus32 + kTwoPowMinus32 / 2.0f;
}

// The largest float below 1 (1 - 2^-24): where a uniform of exactly 1 is moved, so that
// -log(-log(u)) stays finite.
inline constexpr float kBelowOne = 0.99999994039535522f;
static_assert(kBelowOne == 1.0f - 1.0f / 16777216.0f, "1 - 2^-24 must be exact");
DC_HD float clamp_below_one(float u) { return u < kBelowOne ? u : kBelowOne; }

// curand_uniform after curand_init(seed, subsequence, offset), clamped into (0, 1).
DC_HD float curand_philox_uniform(std::uint64_t seed, std::uint64_t subsequence,
                                  std::uint64_t offset) {
  return clamp_below_one(curand_uniform_from_bits(curand_philox_bits(seed, subsequence, offset)));
}

// Standard Gumbel from u in (0, 1): -log(-log(u)). In double, so that the two backends' logs
// (each within an ulp or so of the truth) agree once the perturbed score is rounded to float.
// Over the uniforms cuRAND can produce, the result lies in about [-3.13, 16.64].
DC_HD double gumbel_from_uniform(double u) { return -log(-log(u)); }

// The cuRAND offset of a stream: one whole counter block (4 outputs) per stream, so stream s
// reads block s of its row's subsequence and streams never share bits. Streams < 2^62.
DC_HD std::uint64_t gumbel_stream_offset(std::uint64_t stream) { return 4 * stream; }

// The Gumbel noise of `row` for (seed, stream): the uniform of (seed, subsequence = row,
// offset = 4 * stream). Every (seed, eviction/rollout stream, row) gets independent noise, and a
// CUDA kernel reproduces it with curand_init(seed, row, 4 * stream, &s); curand_uniform(&s).
DC_HD double gumbel_noise(std::uint64_t seed, std::uint64_t stream, std::uint64_t row) {
  return gumbel_from_uniform(curand_philox_uniform(seed, row, gumbel_stream_offset(stream)));
}

}  // namespace dc::math
