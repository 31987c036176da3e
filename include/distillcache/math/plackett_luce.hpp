#pragma once
// Plackett-Luce pieces shared by both backends and by the trainer.
//
// A Gumbel-top-k draw is an ordered Plackett-Luce sample: perturb every score s_i of a group by
// independent standard Gumbel noise g_i and sort by s_i + g_i descending; the first B rows, in
// that order, are distributed as B successive draws without replacement with probabilities
// softmax(s over the not-yet-picked). Without noise the same sort is the deterministic top-B.
//
// This header holds what both backends must agree on bit for bit: the perturbed score, the one
// sort key that orders rows (score descending, then older position), and the flat layout of the
// samples of several groups (GroupSamples). rl/plackett_luce.hpp has the log-probability and its
// gradient, which use log_add_exp from here.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"

namespace dc {

// Which Gumbel noise a draw uses: math::gumbel_noise(seed, stream, row) (math/philox.hpp). One
// seed per run; one stream per eviction / rollout, so K rollouts of a context are independent.
struct GumbelNoise {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};

// Ordered samples (or top-B sets) of several groups, flat:
//   rows    [offsets.back()]  global row ids, group after group, each group's in pick order
//                             (first pick first);
//   offsets [groups + 1]      group g's picks are rows[offsets[g], offsets[g + 1]); a group of
//                             n rows gets min(B, n) picks.
struct GroupSamples {
  std::vector<std::int32_t> rows;
  std::vector<std::int32_t> offsets;

  int groups() const { return offsets.empty() ? 0 : int(offsets.size()) - 1; }
  std::span<const std::int32_t> group(int g) const {
    DC_CHECK(g >= 0 && g < groups(), "GroupSamples::group: group ", g, " of ", groups());
    return std::span<const std::int32_t>(rows).subspan(
        std::size_t(offsets[std::size_t(g)]),
        std::size_t(offsets[std::size_t(g) + 1] - offsets[std::size_t(g)]));
  }
};

// group_offsets [groups + 1] splits `rows` rows into groups: group g is rows
// [off[g], off[g + 1]). It must start at 0, never decrease and end at rows. `who` names the
// caller in the message.
inline void check_group_offsets(std::span<const std::int32_t> group_offsets, std::size_t rows,
                                const char* who) {
  DC_CHECK(!group_offsets.empty(), who, ": group_offsets is empty (it needs groups + 1 entries, ",
           "starting at 0)");
  DC_CHECK(group_offsets[0] == 0, who, ": group_offsets[0] is ", group_offsets[0],
           ", expected 0");
  for (std::size_t g = 0; g + 1 < group_offsets.size(); ++g)
    DC_CHECK(group_offsets[g + 1] >= group_offsets[g], who, ": group_offsets decrease at group ",
             g, " (", group_offsets[g], " then ", group_offsets[g + 1], ")");
  DC_CHECK(std::size_t(group_offsets.back()) == rows, who, ": group_offsets end at ",
           group_offsets.back(), " but there are ", rows, " rows");
}

// The offsets [groups + 1] of GroupSamples for a budget: group g gets min(budget, n_g) picks.
// group_offsets must be valid (check_group_offsets).
inline std::vector<std::int32_t> sample_offsets(std::span<const std::int32_t> group_offsets,
                                                int budget) {
  DC_CHECK(budget >= 0, "sample_offsets: negative budget ", budget);
  std::vector<std::int32_t> out(group_offsets.size(), 0);
  for (std::size_t g = 0; g + 1 < group_offsets.size(); ++g) {
    const std::int32_t n = group_offsets[g + 1] - group_offsets[g];
    out[g + 1] = out[g] + (n < budget ? n : budget);  // total <= rows: no overflow
  }
  return out;
}

namespace math {

// log(exp(a) + exp(b)) without overflow or the cancellation of subtracting exponentials;
// -inf is the empty sum.
DC_HD double log_add_exp(double a, double b) {
  const double hi = a > b ? a : b;
  const double lo = a > b ? b : a;
  if (lo == -INFINITY) return hi;
  return hi + log1p(exp(lo - hi));
}

// The perturbed score s + g, rounded once to float: the sort key both backends build.
DC_HD float perturbed_score(float score, double gumbel) { return float(double(score) + gumbel); }

// A monotone map of (non-NaN) floats to unsigned integers: a < b iff bits(a) < bits(b). -0 and
// +0 map to the same value, as they compare equal. Negative floats have their bits reversed
// (larger magnitude = smaller), non-negative ones move above them.
DC_HD std::uint32_t float_order_bits(float x) {
  if (x == 0.0f) x = 0.0f;  // -0 -> +0
#if defined(__CUDA_ARCH__)
  const std::uint32_t u = __float_as_uint(x);
#else
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The one ordering of a group's rows, as a 64-bit key sorted DESCENDING: higher (perturbed)
// score first, then older (smaller) position. Rows with equal keys (same score and position)
// are ordered by ascending row id, which the device gets from a stable sort of rows in order.
DC_HD std::uint64_t topk_sort_key(float score, std::int32_t position) {
  // Flipping the sign bit maps int32 order onto uint32 order; subtracting from the maximum
  // reverses it, so a smaller position gives a larger key.
  const std::uint32_t pos_order = std::uint32_t(position) ^ 0x80000000u;
  return (std::uint64_t(float_order_bits(score)) << 32) | std::uint64_t(0xFFFFFFFFu - pos_order);
}

}  // namespace math
}  // namespace dc
