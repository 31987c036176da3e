#pragma once
// ln(x) from plain float arithmetic, so that a loop over an array of them vectorises (glibc's
// logf is a call the compiler cannot vectorise without -ffast-math). The learned policy's inputs
// take three or four logarithms per cached row: at 737k rows (SmolLM2 at 8k, one keep-set per
// KV head) logf was a seventh of the policy's whole scoring.
//
// Method: x = 2^e m with m in [sqrt(1/2), sqrt(2)), read from the float's bits; then
// ln m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + s^7/7 + s^9/9 + ...), s = (m - 1) / (m + 1),
// |s| <= 0.1716, truncated after s^9 (the first term left out is below 1e-9 of ln m); and
// ln x = e ln2 + ln m with ln2 split into a high part exact in float and a low correction.
// Accuracy: within 2 float ulps of ln x plus 1e-7 absolute near x = 1 (tested against double
// precision over the float range). Subnormal x is scaled by 2^23 first; 0 gives -inf, +inf
// gives +inf, negative x and NaN give NaN, as logf.
#include <bit>
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"

namespace dc::math {

// Branch-free selects throughout (they vectorise). On the device, logf (a fast hardware-assisted
// routine there).
DC_HD_INLINE float log_poly(float x) {
#ifdef __CUDA_ARCH__
  return logf(x);
#else
  constexpr float kLn2Hi = 0.693145751953125f;  // 11 significant bits: e * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  constexpr float kTwo23 = 8388608.0f;
  constexpr float kSmallestNormal = 1.17549435e-38f;
  const bool subnormal = x < kSmallestNormal;  // also 0 and negative: fixed up at the end
  const float xs = subnormal ? x * kTwo23 : x;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(xs);
  // Exponent relative to [sqrt(1/2), sqrt(2)): adding the bits of 1 - sqrt(1/2)'s offset
  // (0x3f3504f3 is sqrt(1/2)) moves the exponent up by one exactly where m >= sqrt(2).
  const std::uint32_t shifted = bits - 0x3f3504f3u;
  const std::int32_t e = std::int32_t(shifted) >> 23;  // arithmetic shift: e may be negative
  const float m = std::bit_cast<float>((shifted & 0x007fffffu) + 0x3f3504f3u);
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  float p = 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  const float ln_m = 2.0f * s + 2.0f * s * s2 * p;
  const float ef = float(e) - (subnormal ? 23.0f : 0.0f);
  const float result = ef * kLn2Hi + (ef * kLn2Lo + ln_m);
  constexpr float kInf = std::bit_cast<float>(0x7f800000u);
  constexpr float kNaN = std::bit_cast<float>(0x7fc00000u);
  return x > 0.0f ? (x < kInf ? result : x) : (x == 0.0f ? -kInf : kNaN);
#endif
}

}  // namespace dc::math
