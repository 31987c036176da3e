#pragma once
// Checks that floating-point input is usable, with errors that say which entry is bad and how.
//
// Two rules, because the two kinds of data mean different things:
//   values (features, weights): every entry must be finite.
//   logits: NaN and +inf are rejected, -inf is allowed (a banned token has probability zero),
//           but at least one entry must be finite or there is no distribution at all.
// A NaN anywhere in the pipeline would otherwise turn into a silently wrong argmax, an
// arbitrary keep-set or a NaN KL, so every public entry point that takes such data checks it.
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

#include "error.hpp"

namespace dc {

inline const char* describe_non_finite(float x) {
  return std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf";
}

// True when every entry is finite. x - x is +0 for a finite x and NaN for inf or NaN; the
// integer OR vectorises (a loop that stops at the first bad entry does not), which matters
// where every eviction checks its 700k feature entries.
inline bool all_finite(std::span<const float> values) {
  int bad = 0;
  for (const float x : values) bad |= !(x - x == 0.0f);
  return bad == 0;
}

// what names the data in the message, e.g. "feature 'alpha'".
inline void check_all_finite(std::span<const float> values, std::string_view what) {
  if (all_finite(values)) return;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      DC_FAIL(what, ": entry ", i, " is ", describe_non_finite(values[i]));
}

inline void check_logits(std::span<const float> logits, std::string_view what) {
  DC_CHECK(!logits.empty(), what, ": no logits");
  bool any_finite = false;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (std::isnan(x) || x == INFINITY)
      DC_FAIL(what, ": logit of token ", i, " is ", describe_non_finite(x));
    any_finite = any_finite || x != -INFINITY;
  }
  DC_CHECK(any_finite, what, ": every logit is -inf, so there is no distribution");
}

}  // namespace dc
