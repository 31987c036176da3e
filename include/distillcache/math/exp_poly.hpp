#pragma once
// e^x for x <= 0 from plain float arithmetic, so that a loop over an array of them vectorises
// (glibc's expf is a call the compiler cannot vectorise without -ffast-math). The CPU attention's
// softmax calls it once per cached token per head per step: at a 512-token cache that was a
// third of a decode step.
//
// Method (Cody-Waite): x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, ln2 split into
// a high part exact in float and a low correction; e^r by its degree-6 Taylor-Horner polynomial
// (truncation error < 1.3e-8 relative on that interval); 2^n built in the exponent bits. The
// rounding uses the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22), so no library call remains.
// Accuracy: within 3 float ulps of e^x (tested against double precision). Below -87.3 (e^x under
// the smallest normal float) and at -inf (a masked score) it returns 0; NaN returns NaN. The
// result is in [0, 1] for x <= 0.
#include <bit>
#include <cmath>
#include <cstdint>

namespace dc::math {

// Host only (the CUDA kernels use expf). Explicit FMAs: the compiler's own contraction could
// round a vectorised body and its scalar remainder differently.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 11 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  constexpr float kMin = -87.3365447505531f;  // ln(2^-126)
  // Branch-free selects (they vectorise): NaN passes through, so a NaN score still poisons the
  // softmax as glibc's expf would, instead of silently weighing 0.
  const bool is_nan = x != x;
  const bool underflow = x < kMin;  // also -inf
  const float xc = (underflow || is_nan) ? 0.0f : x;
  const float shifted = std::fma(xc, kLog2e, kRound);
  const float n = shifted - kRound;
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, xc));
  float p = 1.0f / 720.0f;
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // 2^n for n in [-126, 0]: the biased exponent n + 127 shifted into place.
  const std::int32_t exponent = static_cast<std::int32_t>(n) + 127;
  const float scale = std::bit_cast<float>(static_cast<std::uint32_t>(exponent) << 23);
  return is_nan ? x : underflow ? 0.0f : p * scale;
}

}  // namespace dc::math
